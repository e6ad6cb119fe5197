#!/usr/bin/env bash
# On a GPU machine without a package registry: installs the carried jax-triton
# wheel and this package into /tmp, then runs the given phases.
#   bash scripts/device_run.sh JT PHASE...   JT: 03 (jax-triton 0.3.1) or 04 (0.4.1 + triton 3.6 shim)
#   phases: info | save-autotune | test-fixed | test-tuned | test-gluon | test-gluon-walks | test-gluon-local | test-slow | test-chunk | bench | bench-chunk | bench-backward | bench-decode | breakdown | ab | profile-backward | test-cp | bench-cp | train | sweep | variants | profile | profile-ws | host-cost | assembler | <any command, run with the env set>
# Carry: .whl (jt03/, jt04/ wheels; fla/ with the fla-core wheel for the comparison columns),
# and .triton_autotune.tgz where an earlier call saved it.
# Under 04, scripts/triton36_shim (a sitecustomize) goes on the path.
set -uo pipefail
JT=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Compiles carry over between the processes of one machine: jax-triton 0.4
# compiles Triton to PTX itself (Triton's cache does not see it) and XLA
# assembles the PTX, so JAX's persistent cache keeps the executables; the
# autotuner's choices go to GDN_JAX_CACHE_DIR.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TRITON_CACHE_DIR=/tmp/triton_cache \
  JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  GDN_JAX_CACHE_DIR=/tmp/gdn_jax_cache
python3 -m pip install -q --no-index --no-deps --target /tmp/jt$JT .whl/jt$JT/*.whl || exit 1
# Triton's autotuner results of an earlier machine (phase save-autotune; carry
# .triton_autotune.tgz; the benchmarks put TRITON_CACHE_DIR back after
# jax-triton's import deletes it, bench_fwd_intra.torch_triton_cache):
# fla's kernels (cache_results) then compile their
# chosen configs only instead of timing every config (130 to 190 s a new kind
# of shape), where the image's triton and the kernels' sources match.
[ -f .triton_autotune.tgz ] && mkdir -p "$TRITON_CACHE_DIR" && tar -xzf .triton_autotune.tgz -C "$TRITON_CACHE_DIR"
# The package as users get it (kernels/ mapped to gdn_jax.kernels); a copy if the
# image's setuptools cannot build it offline.
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/pkg . >"$OUT/install.log" 2>&1; then
  echo "pip install of the package failed (see install.log); using a copy"; tail -3 "$OUT/install.log"
  rm -rf /tmp/pkg && mkdir -p /tmp/pkg && cp -r gdn_jax /tmp/pkg/ && cp -r kernels /tmp/pkg/gdn_jax/kernels
fi
SHIM=""; [ "$JT" = 04 ] && SHIM=:$PWD/scripts/triton36_shim
FLA=""
if ls .whl/fla/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/fla .whl/fla/*.whl && FLA=:/tmp/fla
fi
export PYTHONPATH=/tmp/jt$JT$SHIM:/tmp/pkg$FLA
for phase in "$@"; do
  case $phase in
    info) python3 -P -c "import jax, jax_triton, triton, torch, gdn_jax; print('jax', jax.__version__, 'jax_triton', jax_triton.__version__, 'triton', triton.__version__, 'torch', torch.__version__, jax.devices(), gdn_jax.__file__)";;
    # Compiling dominates: the whole GPU suite runs with one fixed config per
    # kernel (GDN_JAX_AUTOTUNE=0) in 8 processes (~250 s for ~170 tests on an
    # H200), then the tuned kernels (gdn_jax.autotune) on the T=4096 and
    # the traced-varlen cases, then the slow ones (tensors of tens of GB)
    # alone. Each phase takes minutes: run each in its own device call.
    test-fixed) GDN_JAX_AUTOTUNE=0 python3 -P -m pytest -q -rfs -m "gpu and not slow" -n 8 -p no:cacheprovider tests 2>&1 | tee "$OUT/test_jt$JT.log" | tail -25;;
    test-tuned) python3 -P -m pytest -q -rfs -m gpu -k "(test_fixed_length and 4096) or varlen" -n 8 -p no:cacheprovider tests/test_gpu.py tests/test_chunk.py 2>&1 | tee "$OUT/test_tuned_jt$JT.log" | tail -12;;
    # the Gluon walks against the Triton walks, then the gradient tests through
    # them, the forward's storing walk switched on (GDN_JAX_GLUON_FWD_WALK=1), fixed configs
    test-gluon-walks) GDN_JAX_GLUON_FWD_WALK=1 GDN_JAX_AUTOTUNE=0 python3 -P -m pytest -q -rfs -m "gpu and not slow" -n 8 \
      -p no:cacheprovider tests/test_chunk_fwd_gluon.py tests/test_chunk_bwd_gluon.py tests/test_chunk_grad_gpu.py \
      tests/test_intra_grad_gpu.py 2>&1 | tee "$OUT/test_gluon_walks_jt$JT.log" | tail -25;;
    # the Gluon per-chunk and WY kernels against the Triton ones, then the gradient
    # tests through both (GDN_JAX_GLUON_BWD_LOCAL=1 GDN_JAX_GLUON_WY=1), fixed configs
    test-gluon-local) GDN_JAX_GLUON_BWD_LOCAL=1 GDN_JAX_GLUON_WY=1 GDN_JAX_AUTOTUNE=0 python3 -P -m pytest -q -rfs -m "gpu and not slow" -n 8 \
      -p no:cacheprovider tests/test_chunk_bwd_local_gluon.py tests/test_chunk_grad_gpu.py \
      2>&1 | tee "$OUT/test_gluon_local_jt$JT.log" | tail -25;;
    # the whole forward, its gradients and decode against float64, fixed configs
    test-chunk) GDN_JAX_AUTOTUNE=0 python3 -P -m pytest -q -rfs -m "gpu and not slow" -n 8 -p no:cacheprovider tests/test_chunk_gpu.py tests/test_chunk_grad_gpu.py tests/test_fused_recurrent_gpu.py 2>&1 | tee "$OUT/test_chunk_jt$JT.log" | tail -25;;
    # the autotuner results in Triton's cache, to carry to a later machine (see above)
    save-autotune) (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | tar -czf "$OUT/triton_autotune.tgz" -T -) \
      && echo "saved $(tar -tzf "$OUT/triton_autotune.tgz" | wc -l) autotune results";;
    bench-chunk) python3 -P benchmarks/bench_chunk.py --out "$OUT" 2>&1 | tee "$OUT/bench_chunk.log" | tail -14;;
    bench-backward) python3 -P benchmarks/bench_chunk.py --backward --no-reference --out "$OUT" 2>&1 | tee "$OUT/bench_backward.log" | tail -12;;
    # context parallelism: the segment math on the kernels (one GPU), then one GPU against T sharded over all
    test-cp) GDN_JAX_AUTOTUNE=0 python3 -P -m pytest -q -rfs -m gpu -p no:cacheprovider tests/test_context_parallel_gpu.py 2>&1 | tee "$OUT/test_cp_jt$JT.log" | tail -12;;
    bench-cp) python3 -P benchmarks/bench_context_parallel.py --out "$OUT" 2>&1 | tee "$OUT/bench_cp.log" | tail -10;;
    bench-decode) python3 -P benchmarks/bench_decode.py --out "$OUT" 2>&1 | tee "$OUT/bench_decode.log" | tail -14;;
    # GPU time per kernel (ours from the JAX trace, fla's from torch.profiler), forward and forward + backward
    breakdown) python3 -P benchmarks/kernel_breakdown.py --out "$OUT" 2>&1 | tee "$OUT/breakdown.log" | tail -40;;
    # the same, gdn-jax only, for the working tree (new/) and for every side
    # that scripts/ab_base.sh put in an .ab_NAME folder (carry them): an A/B
    # in one call (AB_SHAPE: kernel_breakdown.py's --shape, default
    # headline), the working tree first and again last (the spread of one
    # side's step in one call), at the fixed configs: kernel code against
    # kernel code, and with the autotuned kernels the forward + backward
    # trace of 10 steps passed protobuf's 2 GB (2.44 GB on an H100) and came
    # back empty; a side's .ab_NAME/ENV (lines NAME=VALUE) sets its environment
    # (a switch such as GDN_JAX_GLUON_FWD_WALK=1 against the same code)
    ab) sides=$(ls -d .ab_*/gdn_jax 2>/dev/null | cut -d/ -f1)
      [ -n "$sides" ] || { echo "ab: no .ab_* side (scripts/ab_base.sh, and carry it)"; continue; }
      for side in new $sides new_again; do
        case $side in
          new|new_again) name=$side; path=$PYTHONPATH; what="working tree";;
          *) name=${side#.ab_}; what=$(cat "$side/REF")
            rm -rf "/tmp/pkg_$name" && mkdir -p "/tmp/pkg_$name" && cp -r "$side/gdn_jax" "/tmp/pkg_$name/"
            path=:$PYTHONPATH:; path=${path/:\/tmp\/pkg:/:\/tmp\/pkg_$name:}; path=${path#:}; path=${path%:};;
        esac
        side_env=""; [ -f "$side/ENV" ] && side_env=$(tr '\n' ' ' < "$side/ENV") && what="$what, $side_env"
        echo "== $name: $what"
        env $side_env GDN_JAX_AUTOTUNE=0 PYTHONPATH=$path python3 -P benchmarks/kernel_breakdown.py --no-fla \
          --shape "${AB_SHAPE:-headline}" --out "$OUT/$name" 2>&1 | tail -24
      done;;
    train) python3 -P examples/train_gdn.py --width 256 --heads 2 --v-heads 4 --head-dim 64 --batch 64 --copy-len 32 --dtype bfloat16 2>&1 | tee "$OUT/train.log" | tail -10;;
    # impl="gluon" (jax-triton 0.4: run under 04), no XLA flags
    test-gluon) python3 -P -m pytest -q -rfs -n 8 -p no:cacheprovider tests/test_gluon_gpu.py tests/test_gluon_launch.py 2>&1 | tee "$OUT/test_gluon_jt$JT.log" | tail -12;;
    test-slow) python3 -P -m pytest -q -rfs -m "gpu and slow" -p no:cacheprovider tests 2>&1 | tee "$OUT/test_slow_jt$JT.log" | tail -12;;
    # the table (JSON written after every shape), then the T sweep for the chart
    bench) python3 -P benchmarks/bench_fwd_intra.py --out "$OUT" 2>&1 | tee "$OUT/bench_jt$JT.log" | tail -12;;
    sweep) python3 -P benchmarks/bench_fwd_intra.py --out "$OUT/sweep" --no-reference --shapes headline --sweep 2>&1 | tee "$OUT/sweep_jt$JT.log" | tail -12;;
    # kernel variants (benchmarks/bench_fwd_intra.py VARIANTS) against the shipped
    # kernels, torch do_bench at the headline: VARIANTS=name,name (8 take ~310 s)
    variants) python3 -P benchmarks/bench_fwd_intra.py --out "$OUT/variants" --torch-only --shapes headline --variants "${VARIANTS:?set VARIANTS=name,name}" 2>&1 | tee "$OUT/variants_jt$JT.log" | tail -6;;
    # Nsight Compute on one path's kernels at the headline, fixed configs
    # (benchmarks/profile_split.py; PROFILE_ARGS="--variant NAME" profiles a
    # variant): the report, its details page and the stall summary
    # (benchmarks/ncu_stalls.py).
    profile)
      PYTHONPATH=$PYTHONPATH:$PWD/benchmarks ncu --clock-control none --set full --import-source no \
        -k regex:'gdn_fwd_intra_A_kernel|recompute_w_u' --launch-skip 2 --launch-count 2 -f -o "$OUT/split" \
        python3 -P benchmarks/profile_split.py ${PROFILE_ARGS:-} > "$OUT/ncu.log" 2>&1
      ncu --import "$OUT/split.ncu-rep" --page details > "$OUT/split_details.txt"
      ncu --import "$OUT/split.ncu-rep" --page source --print-source sass --csv > /tmp/split_source.csv
      python3 benchmarks/ncu_stalls.py /tmp/split_source.csv | tee "$OUT/split_stalls.txt";;
    # Nsight Compute on the backward's three kernels (benchmarks/profile_backward.py, torch launch, fixed configs)
    profile-backward)
      PYTHONPATH=$PYTHONPATH:$PWD/benchmarks ncu --clock-control none --set full --import-source no \
        -k regex:'gdn_chunk_bwd_local|gdn_wy_bwd|gdn_chunk_bwd_walk' --launch-skip 3 --launch-count 3 -f -o /tmp/bwd \
        python3 -P benchmarks/profile_backward.py > "$OUT/ncu_backward.log" 2>&1
      ncu --import /tmp/bwd.ncu-rep --page details > "$OUT/backward_details.txt"
      ncu --import /tmp/bwd.ncu-rep --page source --print-source sass --csv > /tmp/bwd.csv
      python3 benchmarks/ncu_stalls.py /tmp/bwd.csv --top 14 | tee "$OUT/backward_stalls.txt";;
    # Nsight Compute on the warp-specialized Gluon probe (benchmarks/gluon_ws_probe.py),
    # one report, details page and stall summary per config: PROFILE_CONFIGS="a b"
    profile-ws)
      for c in ${PROFILE_CONFIGS:-shipped}; do
        ncu --clock-control none --set full --import-source no -k regex:gdn_fwd_intra_ws --launch-skip 1 \
          --launch-count 1 -f -o "$OUT/$c" python3 -P benchmarks/gluon_ws_probe.py --profile "$c" > "$OUT/ncu_$c.log" 2>&1
        ncu --import "$OUT/$c.ncu-rep" --page details > "$OUT/${c}_details.txt"
        ncu --import "$OUT/$c.ncu-rep" --page source --print-source sass --csv > "$OUT/$c.csv"
        python3 benchmarks/ncu_stalls.py "$OUT/$c.csv" --top 16 | tee "$OUT/${c}_stalls.txt"
      done;;
    # host time per call against the custom calls' opaque size, every Triton path
    host-cost) PYTHONPATH=$PYTHONPATH:$PWD/benchmarks python3 -P benchmarks/host_cost.py --out "$OUT" 2>&1 | tee "$OUT/host_cost_jt$JT.log" | tail -14;;
    # Which assembler jaxlib runs on jax-triton's PTX, and JAX's GPU time at the
    # headline against the torch launch (one fixed config on both sides) with
    # it, then with Triton's own ptxas (the one torch's launch uses). jaxlib
    # compiles the PTX with XLA's CompileGpuAsm, which takes the first ptxas of
    # a fixed list of folders (the python's bin folder, then /usr/local/nvidia,
    # /usr/local/cuda; neither PATH nor --xla_gpu_cuda_data_dir changes it):
    # Triton's is linked into the python's bin folder for the
    # second run, and removed after it.
    assembler)
      bindir=$(dirname "$(command -v python3)")
      tptxas="$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))')/backends/nvidia/bin/ptxas"
      for run in default triton; do
        [ $run = triton ] && { [ -e "$bindir/ptxas" ] && { echo "$bindir/ptxas exists; skipped"; break; }; ln -s "$tptxas" "$bindir/ptxas"; }
        TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=subprocess_compilation=3 TRITON_CACHE_DIR=/tmp/triton_cache_$run \
          python3 -P benchmarks/bench_fwd_intra.py --fixed-config --no-reference --shapes headline --out "$OUT/assembler_$run" 2>&1 \
          | grep -oE "Using [^ ]*ptxas with version [0-9.]+|^\\| headline.*" | sort -u | tee -a "$OUT/assembler.log"
        [ $run = triton ] && rm -f "$bindir/ptxas"
      done;;
    *) bash -c "$phase";;
  esac
done
