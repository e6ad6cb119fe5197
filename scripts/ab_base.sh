#!/usr/bin/env bash
# A side of an A/B: the package laid out as installed (kernels/ inside gdn_jax/)
# in .ab_NAME/ (ignored), at a git ref or as the working tree is now. Carry
# the .ab_* folders to the GPU machine for the `ab` phase of
# scripts/device_run.sh, which profiles the step of the working tree and of
# every .ab_* side in one call (same machine, same process setup).
#   bash scripts/ab_base.sh REF [NAME]        the package at REF (HEAD, main~2, a commit); NAME defaults to base
#   bash scripts/ab_base.sh --worktree NAME   the working tree's package (an uncommitted variant: make it, then undo the edit)
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/ab_base.sh REF [NAME] | --worktree NAME"
ref=${1:?$usage}
if [ "$ref" = --worktree ]; then name=${2:?$usage}; else name=${2:-base}; fi
dir=.ab_$name
rm -rf "$dir" && mkdir -p "$dir"
if [ "$ref" = --worktree ]; then
  cp -r gdn_jax "$dir/" && cp -r kernels "$dir/gdn_jax/kernels"
  find "$dir" -name __pycache__ -prune -exec rm -rf {} +
  edits=""; git diff --quiet -- gdn_jax kernels || edits=" with uncommitted edits"
  echo "the working tree at $(git rev-parse --short HEAD)$edits" > "$dir/REF"
else
  git archive "$ref" gdn_jax kernels | tar -x -C "$dir"
  mv "$dir/kernels" "$dir/gdn_jax/kernels"
  git rev-parse --short "$ref" > "$dir/REF"
fi
echo "$dir: gdn_jax, $(cat "$dir/REF")"
