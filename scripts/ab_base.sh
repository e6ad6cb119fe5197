#!/usr/bin/env bash
# The package at a git ref, laid out as installed (kernels/ inside gdn_jax/),
# in .ab_base/ (ignored): carry it to the GPU machine for the `ab` phase of
# scripts/device_run.sh, which profiles the step of the working tree and of
# this base in one call (same machine, same process setup).
#   bash scripts/ab_base.sh REF      e.g. HEAD, main~2, a commit
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/ab_base.sh REF}
rm -rf .ab_base && mkdir -p .ab_base
git archive "$ref" gdn_jax kernels | tar -x -C .ab_base
mv .ab_base/kernels .ab_base/gdn_jax/kernels
echo "$(git rev-parse --short "$ref")" > .ab_base/REF
echo ".ab_base: gdn_jax at $(cat .ab_base/REF)"
