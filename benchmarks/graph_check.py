"""GPU machine: ten ``fwd_intra`` calls chained in one ``jax.jit`` (XLA may
run such a sequence as a CUDA graph, a command buffer), per path and launch
option; prints ok or the error. ``python3 benchmarks/graph_check.py MODE``,
MODE one of split, gluon, gluon_side_effect (the launch marked
``has_side_effect``), gluon_no_command_buffer (XLA_FLAGS set below)."""
import os
import sys

mode = sys.argv[1]
if mode == "gluon_no_command_buffer":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer="

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import gdn_jax  # noqa: E402

if mode == "gluon_side_effect":
    import jax_triton as jt

    jt.triton_call = functools.partial(jt.triton_call, has_side_effect=True)
impl = "split" if mode == "split" else "gluon"
B, T, Hg, H = 8, 1024, 16, 32
kk, kv, kb, kg = jax.random.split(jax.random.key(0), 4)
k = jax.random.normal(kk, (B, T, Hg, 128))
k = (k / jnp.linalg.norm(k, axis=-1, keepdims=True)).astype(jnp.bfloat16)
v = jax.random.normal(kv, (B, T, H, 128)).astype(jnp.bfloat16)
beta = jax.nn.sigmoid(jax.random.normal(kb, (B, T, H)))
g = jnp.cumsum(-0.3 * jax.random.uniform(kg, (B, T // 64, 64, H)), axis=2).reshape(B, T, H)


@jax.jit
def chain(k, v, g, beta):
    outs = []
    for i in range(10):
        w, u, A = gdn_jax.fwd_intra(k, v, g, beta * (1 + 0.01 * i), impl=impl)
        outs.append(w[0, 0, 0, 0] + u[-1, -1, -1, -1] + A[0, 1, 0, 0])
    return jnp.stack(outs)


try:  # XLA records a command buffer on a later execution than the first: run it three times
    for _ in range(3):
        res = jax.block_until_ready(chain(k, v, g, beta))
    print(mode, "ok", res[:3], flush=True)
except Exception as e:  # noqa: BLE001
    print(mode, "error", repr(e)[:300], flush=True)

if len(sys.argv) > 2:  # also: the bench's chain of launches (gdn_jax.autotune.repeated) at B, T
    from gdn_jax import autotune

    B, T = map(int, sys.argv[2].split("x"))
    ops = [x[:B, :T] for x in (k, v, g, beta)] if T <= 1024 else None
    if ops is None:
        k2 = jnp.tile(k[:1], (B, T // 1024, 1, 1))
        ops = [k2, jnp.tile(v[:1], (B, T // 1024, 1, 1)), jnp.tile(g[:1], (B, T // 1024, 1)),
               jnp.tile(beta[:1], (B, T // 1024, 1))]
    run = autotune.repeated(lambda o, impl: gdn_jax.fwd_intra(*o, impl=impl), ops, [0, 1, 2, 3], dict(impl=impl))
    try:
        for _ in range(3):
            res = jax.block_until_ready(run(*ops))
        print(mode, B, T, "repeated ok", float(res[0][0]), flush=True)
    except Exception as e:  # noqa: BLE001
        print(mode, B, T, "repeated error", repr(e)[:300], flush=True)
