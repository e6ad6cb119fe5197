"""Context parallel runs (``T`` sharded) on virtual CPU devices;
tests/test_context_parallel.py runs this in a subprocess per device count.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/context_parallel_cases.py SEED [CASE ...]

Each case runs ``chunk_gated_delta_rule`` and ``jax.grad`` of a loss through
``o`` and the final state under ``jax.jit`` on sharded inputs and prints one
JSON line: ``{"case", "err" (largest relative error of the outputs and every
gradient against the unsharded run), "err64" (the same against the float64
per-token recurrence, where computed), "specs" (output PartitionSpecs),
"collectives" ([kind, shape] of every collective in the compiled HLO of the
gradient step), "T_local", "state_elems" (the largest state-sized array
allowed to move)}``, or ``{"case", "error"}``.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import gdn_jax  # noqa: E402
import gdn_jax.reference  # noqa: E402
from gdn_jax.naive_recurrent import naive_recurrent_gated_delta_rule  # noqa: E402
from numpy_reference import rel_err as rel  # noqa: E402
from repo_files import load_module  # noqa: E402
from sharding_specs import spec_of  # noqa: E402
from stand_ins import doubling_solve  # noqa: E402
from test_chunk_grad import draw  # noqa: E402

hlo_collectives = load_module("benchmarks/hlo_collectives.py")

ARGS = ("q", "k", "v", "g", "beta", "initial_state")
K, V = 16, 8


gdn_jax.reference.solve_triangular = doubling_solve


def case(seed, shape, names, B, T, Hg, H, *, seq, batch=None, heads=None, cu=None, h0=True,
         final=True, float64=False, cu_const=False, **kwargs):
    """The sharded step against the unsharded one (and float64): ``seq``,
    ``batch``, ``heads`` the mesh axes of ``T``, ``B`` and the heads;
    ``cu_const``: ``cu`` a NumPy constant (else a traced argument)."""
    m = jax.make_mesh(shape, names)  # Explicit axes
    N = B if cu is None else len(cu) - 1
    x, (do, dht) = draw(seed, B, T, Hg, H, K, V, N)
    if kwargs.get("state_v_first"):  # states [N, H, V, K]
        x["initial_state"], dht = np.swapaxes(x["initial_state"], -1, -2), np.swapaxes(dht, -1, -2)
    cu = None if cu is None else np.asarray(cu, np.int32)
    argnums = tuple(range(6 if h0 else 5))

    def step(q, k, v, g, beta, h0_, do, dht, cu_arg):
        cu_used = cu if cu_const else cu_arg

        def loss(*a):
            o, f = gdn_jax.chunk_gated_delta_rule(
                *a[:5], initial_state=a[5] if h0 else None, output_final_state=final,
                cu_seqlens=cu_used, **kwargs)
            return jnp.sum(o * do) + (jnp.sum(f * dht) if final else 0.0), (o, f)
        grads, outs = jax.grad(loss, argnums=argnums, has_aux=True)(q, k, v, g, beta, h0_)
        return [o for o in outs if o is not None], list(grads)

    f32 = [jnp.asarray(x[a], jnp.float32) for a in ARGS] + [jnp.asarray(do, jnp.float32),
                                                              jnp.asarray(dht, jnp.float32)]
    tok, gate = P(batch, seq, heads, None), P(batch, seq, heads)
    specs = (tok, tok, tok, gate, gate, P(None if cu is not None else batch, heads), tok,
             P(None if cu is not None else batch, heads))
    sharded = [jax.device_put(a, NamedSharding(m, s)) for a, s in zip(f32, specs)]
    cu_j = None if cu is None else jax.device_put(jnp.asarray(cu), NamedSharding(m, P()))
    fj = jax.jit(step)
    hlo = fj.lower(*sharded, cu_j).compile().as_text()
    outs, grads = fj(*sharded, cu_j)
    ref_outs, ref_grads = jax.jit(step)(*f32, None if cu is None else jnp.asarray(cu))
    err = float(np.max([rel(a, b) for a, b in zip(outs + grads, ref_outs + ref_grads)]))  # NaN stays NaN
    D = int(np.prod([m.shape[a] for a in (seq if isinstance(seq, tuple) else (seq,))]))
    collectives = [[kind, dims] for kind, _, dims in hlo_collectives.collectives(hlo)]
    result = dict(err=err, specs=[spec_of(o) for o in outs], collectives=collectives,
                  T_local=T // D, state_elems=D * max(N, B) * H * K * (V + K))
    if float64:
        with jax.enable_x64(True):
            def loss64(*a):
                o, f = naive_recurrent_gated_delta_rule(
                    *a[:5], initial_state=a[5] if h0 else None, output_final_state=True,
                    cu_seqlens=cu)
                return jnp.sum(o * do) + (jnp.sum(f * dht) if final else 0.0), (o, f)
            x64 = [jnp.asarray(x[a], jnp.float64) for a in ARGS]
            g64, o64 = jax.jit(jax.grad(loss64, argnums=argnums, has_aux=True))(*x64)
            o64 = [o64[0], o64[1]] if final else [o64[0]]
            result["err64"] = float(np.max([rel(a, b) for a, b in zip(outs + grads, o64 + list(g64))]))
    return result


def gpu_path_case(seed, shape, names, impl="triton", **kwargs):
    """The GPU path (its custom_vjp and the kernels' partitioned ops) with
    the launches replaced by their jnp stand-ins (tests/stand_ins.py);
    ``impl`` "auto": the walk from A, whose output block the backward reads."""
    from stand_ins import gpu_path_on_this_cpu

    gpu_path_on_this_cpu()
    return case(seed, shape, names, impl=impl, **kwargs)


def cases(seed, n):
    # 7 sequences: empty, one token, a long one over 3 boundaries, empty, one token, the rest
    cu4 = [0, 0, 1, 30, 290, 290, 291, 384]  # segments of 96 tokens
    cu8 = [0, 3, 3, 100, 101, 460, 512]  # segments of 64: one sequence over 5 boundaries
    common = dict(B=3, Hg=2, H=4)
    if n == 4:
        return {
            "seq_fixed_options_v_first": lambda: case(
                seed, (4,), ("s",), T=256, seq="s", use_qk_l2norm_in_kernel=True,
                use_beta_sigmoid_in_kernel=True, state_v_first=True, **common),
            # T_local = 40: a partial chunk at every segment's end
            "seq_partial_chunks_no_states": lambda: case(seed + 1, (4,), ("s",), T=160, seq="s",
                                                         h0=False, final=False, **common),
            "seq_varlen": lambda: case(seed + 3, (4,), ("s",), B=1, T=384, Hg=2, H=4, seq="s",
                                       cu=cu4, float64=True),
            "seq_x_heads_varlen": lambda: case(seed + 4, (2, 2), ("s", "h"), B=1, T=384, Hg=2,
                                               H=4, seq="s", heads="h", cu=cu4),
            "gpu_path_seq_x_heads_varlen": lambda: gpu_path_case(
                seed + 7, (2, 2), ("s", "h"), impl="auto", B=1, T=384, Hg=2, H=4, seq="s", heads="h",
                cu=cu4),
        }
    return {
        "seq8_varlen_numpy_cu": lambda: case(seed + 9, (8,), ("s",), B=1, T=512, Hg=2, H=4,
                                             seq="s", cu=cu8, cu_const=True, float64=True),
        "seq_x_batch_x_heads": lambda: case(seed + 11, (2, 2, 2), ("b", "s", "h"), B=2, T=256,
                                            Hg=2, H=4, seq="s", batch="b", heads="h"),
        "gpu_path_seq8_fixed": lambda: gpu_path_case(seed + 12, (8,), ("s",), T=512, seq="s",
                                                     **common),
    }


def main(seed, names):
    table = cases(seed, jax.device_count())
    for name in names or list(table):
        try:
            start = time.perf_counter()
            result = table[name]()
            result["seconds"] = round(time.perf_counter() - start, 1)
        except Exception as e:  # noqa: BLE001 - reported to the test
            result = dict(error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        print(json.dumps(dict(case=name, **result)), flush=True)


if __name__ == "__main__":
    assert jax.device_count() in (4, 8), os.environ.get("XLA_FLAGS")
    main(int(sys.argv[1]), sys.argv[2:])
