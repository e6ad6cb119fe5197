"""GPU machine: ten ``fwd_intra`` calls chained in one ``jax.jit`` (XLA may
run such a sequence as a CUDA graph, a command buffer), per path; prints ok
or the error. ``python3 benchmarks/graph_check.py IMPL [BxT]``, IMPL split
or gluon; BxT also runs the bench's chain of launches
(``gdn_jax.autotune.repeated``) at that size. A launch whose kernel needs
global scratch (TMA descriptors made on the device: jaxlib allocates it per
launch with ``cuMemAllocAsync``) fails here unless
``XLA_FLAGS=--xla_gpu_enable_command_buffer=`` turns the graphs off; the
shipped Gluon launch passes its descriptors as parameters and runs
(``results/graph_check.log``)."""
import os
import sys

import jax
import jax.numpy as jnp

import gdn_jax

impl = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fwd_intra import make_inputs  # noqa: E402


def attempt(label, fn):
    """``fn`` three times (XLA records a command buffer on a later execution
    than the first); prints ok and the first values, or the error."""
    try:
        for _ in range(3):
            res = jax.block_until_ready(fn())
        print(impl, label, "ok", jnp.ravel(jnp.stack(jax.tree.leaves(res)))[:3], flush=True)
    except Exception as e:  # noqa: BLE001
        print(impl, label, "error", repr(e)[:300], flush=True)


@jax.jit
def chain(k, v, g, beta):
    outs = []
    for i in range(10):
        w, u, A = gdn_jax.fwd_intra(k, v, g, beta * (1 + 0.01 * i), impl=impl)
        outs.append(w[0, 0, 0, 0] + u[-1, -1, -1, -1] + A[0, 1, 0, 0])
    return jnp.stack(outs)


args = make_inputs(8, 1024, 16, 32, 128, 128)
attempt("chain", lambda: chain(*args))
if len(sys.argv) > 2:  # also: the bench's chain of launches (gdn_jax.autotune.repeated) at B, T
    from gdn_jax import autotune

    B, T = map(int, sys.argv[2].split("x"))
    ops = list(make_inputs(B, T, 16, 32, 128, 128))
    run = autotune.repeated(lambda o, impl: gdn_jax.fwd_intra(*o, impl=impl), ops, [0, 1, 2, 3], dict(impl=impl))
    attempt(f"{B}x{T} repeated", lambda: run(*ops))
