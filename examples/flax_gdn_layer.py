"""A Gated DeltaNet layer in Flax NNX, as Qwen3-Next uses it, on top of gdn_jax.

    python examples/flax_gdn_layer.py                 # small CPU run
    python examples/flax_gdn_layer.py --batch 4 --seq-len 4096 --hidden 2048 \\
        --qk-heads 16 --v-heads 32 --head-dim 128 --dtype bfloat16   # GPU shape

The layer: q/k/v/z/a/b projections, a causal depthwise conv (kernel 4) with
SiLU over q, k, v, then the GDN forward with its options: q and k
L2-normalised, GQA (fewer q/k heads than v heads), ``beta = sigmoid(b)``,
``g = -exp(A_log) * softplus(a + dt_bias)`` (per-step natural-log forget
gate); a gated RMSNorm ``RMSNorm(o) * silu(z)`` per head and the output
projection.

With a cache (:class:`GdnCache`: the conv's last ``conv_size - 1`` inputs and
the recurrent state) the layer continues a sequence: a prefill (no cache, or
more than ``decode_max_tokens`` tokens) runs the chunked forward
(:func:`gdn_jax.chunk_gated_delta_rule`), a decode step (a few tokens with a
cache) the recurrent one (:func:`gdn_jax.fused_recurrent_gated_delta_rule`,
the state updated in place when the cache is donated). examples/generate.py
checks that both give one forward's outputs.
"""
from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gdn_jax.backend import cuda_available, impl_for
from gdn_jax.gluon_launch import gluon_fits
from gdn_jax import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from gdn_jax.validate import IMPLS


class GdnCache(NamedTuple):
    """What a layer carries from one call to the next, per batch row."""
    conv: jax.Array  # [B, conv_size - 1, channels]: the conv's last inputs (q, k, v projections)
    state: jax.Array  # [B, H, K, V]: the recurrent state after the last token


def split_heads(x, mesh, axis):
    """``x [B, T, heads, ...]`` constrained to split its heads over ``axis``
    of ``mesh``; the batch dim keeps whatever sharding XLA gives it."""
    spec = P(P.UNCONSTRAINED, None, axis, *(None,) * (x.ndim - 3))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


class GatedDeltaNet(nnx.Module):
    """Gated DeltaNet token mixer: ``(x [B, T, hidden], cache) -> (y [B, T, hidden], new cache)``.

    Args:
      hidden: model width.
      qk_heads: query/key heads ``Hg``.
      v_heads: value heads ``H`` (a multiple of ``qk_heads``).
      head_dim: ``K = V``, per head.
      conv_size: causal depthwise conv width.
      dtype: compute dtype of projections and of q, k, v fed to the kernel
        (parameters stay float32; gates, norms in float32).
      impl: ``fwd_intra`` implementation of the chunked forward: ``"auto"``,
        ``"gluon"``, ``"triton"``, ``"split"``, ``"seed"`` or ``"reference"``
        (see :func:`gdn_jax.fwd_intra`); decode steps run ``"reference"``
        for ``"reference"``, ``"auto"`` for ``"auto"``, else the Triton kernel.
      heads_over: ``(mesh, axis)`` for tensor parallelism: q, k, v, g, beta
        are split over their heads on that mesh axis (``qk_heads`` divisible by
        its size), so each device runs the GDN forward on its heads; None
        leaves their sharding to XLA (data parallel: shard ``x`` over batch).
      state_dtype: dtype of the cached recurrent state (the math runs in float32).
      decode_max_tokens: with a cache, calls of up to this many tokens run
        the recurrent forward (one read and write of the state), longer ones
        the chunked forward.
    """

    def __init__(self, hidden: int, qk_heads: int, v_heads: int, head_dim: int, *,
                 conv_size: int = 4, dtype=jnp.float32, impl: str = "auto", heads_over=None,
                 state_dtype=jnp.float32, decode_max_tokens: int = 16, rngs: nnx.Rngs):
        if v_heads % qk_heads:
            raise ValueError(f"v_heads={v_heads} must be a multiple of qk_heads={qk_heads}")
        self.qk_heads, self.v_heads, self.head_dim = qk_heads, v_heads, head_dim
        self.dtype, self.impl, self.heads_over = dtype, impl, heads_over
        self.state_dtype, self.decode_max_tokens = state_dtype, decode_max_tokens
        key_dim, value_dim = qk_heads * head_dim, v_heads * head_dim
        linear = partial(nnx.Linear, use_bias=False, dtype=dtype, rngs=rngs)
        self.q_proj = linear(hidden, key_dim)
        self.k_proj = linear(hidden, key_dim)
        self.v_proj = linear(hidden, value_dim)
        self.z_proj = linear(hidden, value_dim)  # output gate
        self.a_proj = linear(hidden, v_heads)  # forget-gate logits
        self.b_proj = linear(hidden, v_heads)  # write-strength logits
        channels = 2 * key_dim + value_dim
        # Causal: the layer puts the conv_size - 1 inputs before the call's in front.
        self.conv = nnx.Conv(channels, channels, kernel_size=(conv_size,), padding="VALID",
                             feature_group_count=channels, use_bias=False, dtype=dtype, rngs=rngs)
        # Per-head decay rate exp(A_log) in [1, 16], and the step dt = softplus(a + dt_bias)
        # log-uniform in [1e-3, 1e-1] at a = 0 (Mamba's and flash-linear-attention's
        # init): per-step decays exp(-exp(A_log) dt) from 0.2 to 0.999, so the state
        # remembers from the start (dt_bias = 1 decays by 0.27 to 1e-9 per token).
        kA, kdt = jax.random.split(rngs.params())
        self.A_log = nnx.Param(jnp.log(jax.random.uniform(kA, (v_heads,), minval=1.0, maxval=16.0)))
        dt = jnp.exp(jax.random.uniform(kdt, (v_heads,), minval=jnp.log(1e-3), maxval=jnp.log(1e-1)))
        self.dt_bias = nnx.Param(dt + jnp.log(-jnp.expm1(-dt)))  # softplus^-1(dt)
        self.norm = nnx.RMSNorm(head_dim, epsilon=1e-6, dtype=jnp.float32, rngs=rngs)
        self.o_proj = linear(value_dim, hidden)

    def init_cache(self, batch: int) -> GdnCache:
        """The cache of a sequence that has not started: zeros."""
        Hg, H, D = self.qk_heads, self.v_heads, self.head_dim
        channels = (2 * Hg + H) * D
        return GdnCache(jnp.zeros((batch, self.conv.kernel_size[0] - 1, channels), self.dtype),
                        jnp.zeros((batch, H, D, D), self.state_dtype))

    def __call__(self, x, cache: GdnCache | None = None):
        """``(y [B, T, hidden], new_cache)`` for ``x [B, T, hidden]``, continuing
        the sequences of ``cache`` (None: they start here)."""
        B, T, _ = x.shape
        Hg, H, D = self.qk_heads, self.v_heads, self.head_dim
        x = x.astype(self.dtype)
        qkv = jnp.concatenate([self.q_proj(x), self.k_proj(x), self.v_proj(x)], axis=-1)
        if cache is None:
            cache = self.init_cache(B)
            state = None
        else:
            state = cache.state
        window = jnp.concatenate([cache.conv.astype(self.dtype), qkv], axis=1)
        conv = window[:, window.shape[1] - cache.conv.shape[1]:]
        q, k, v = jnp.split(jax.nn.silu(self.conv(window)), [Hg * D, 2 * Hg * D], axis=-1)
        q, k = q.reshape(B, T, Hg, D), k.reshape(B, T, Hg, D)
        v = v.reshape(B, T, H, D)
        beta_logits = self.b_proj(x).astype(jnp.float32)
        gate_input = self.a_proj(x).astype(jnp.float32)
        if self.heads_over is not None:
            q, k, v, gate_input, beta_logits = (split_heads(t, *self.heads_over)
                                                for t in (q, k, v, gate_input, beta_logits))
        decode = state is not None and T <= self.decode_max_tokens
        if decode:
            forward = partial(fused_recurrent_gated_delta_rule,
                              impl=self.impl if self.impl in ("auto", "reference") else "triton")
        else:
            forward = partial(chunk_gated_delta_rule, impl=self.impl)
        o, state = forward(q, k, v, gate_input, beta_logits, use_qk_l2norm_in_kernel=True,
                           use_gate_in_kernel=True, A_log=self.A_log[...],
                           dt_bias=self.dt_bias[...], use_beta_sigmoid_in_kernel=True,
                           initial_state=state, output_final_state=True)
        z = self.z_proj(x).reshape(B, T, H, D).astype(jnp.float32)
        o = self.norm(o.astype(jnp.float32)) * jax.nn.silu(z)
        y = self.o_proj(o.reshape(B, T, H * D).astype(self.dtype))
        return y, GdnCache(conv, state.astype(self.state_dtype))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--qk-heads", type=int, default=4)
    p.add_argument("--v-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--impl", choices=list(IMPLS), default="auto")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    dtype = jnp.dtype(args.dtype)
    layer = GatedDeltaNet(args.hidden, args.qk_heads, args.v_heads, args.head_dim,
                          dtype=dtype, impl=args.impl, rngs=nnx.Rngs(args.seed))
    graphdef, state = nnx.split(layer)

    @jax.jit
    def forward(state, x):
        return nnx.merge(graphdef, state)(x)[0]

    x = jax.random.normal(jax.random.key(args.seed + 1),
                          (args.batch, args.seq_len, args.hidden), jnp.float32).astype(dtype)
    y = forward(state, x).block_until_ready()  # compile + warm-up
    forward(state, x).block_until_ready()
    times = []
    for _ in range(max(1, args.repeats)):
        t0 = time.perf_counter()
        forward(state, x).block_until_ready()
        times.append(time.perf_counter() - t0)

    qk = jax.ShapeDtypeStruct((args.batch, args.seq_len, args.qk_heads, args.head_dim), dtype)
    vv = jax.ShapeDtypeStruct((args.batch, args.seq_len, args.v_heads, args.head_dim), dtype)
    path = impl_for(args.batch, args.seq_len, args.v_heads, args.impl, op="GatedDeltaNet",
                    gluon=args.impl == "auto" and gluon_fits(qk, vv, None, None, None))
    print(f"output shape {tuple(y.shape)} dtype {y.dtype}")
    print(f"fwd_intra path: {path} (cuda_available={cuda_available()}, "
          f"backend={jax.default_backend()})")
    print(f"finite: {bool(jnp.isfinite(y.astype(jnp.float32)).all())}")
    print(f"median jitted forward: {statistics.median(times) * 1e3:.3f} ms "
          f"over {len(times)} calls")


if __name__ == "__main__":
    main()
