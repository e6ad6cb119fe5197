"""``fwd_intra``: the public GDN intra-chunk forward (checks, then dispatch)."""
from __future__ import annotations

from .backend import impl_for
from .chunk_indices import varlen_work_list
from .chunk_launch import walk_kernel_fits
from .gluon_launch import check_gluon, gluon_fits
from .intra_bwd import IntraStatic, fwd_intra_with_vjp
from .sharding import fwd_intra_sharded
from .validate import as_array, check_fwd_intra_args, check_impl, check_not_forward_mode, kernel_dtypes


def fwd_intra(k, v, g=None, beta=None, *, cu_seqlens=None, chunk_size=64, chunk_indices=None,
              impl="auto"):
    """GDN intra-chunk forward: the WY representation ``w, u, A`` of every 64-row chunk.

    For every sequence, value head ``h`` and chunk with rows ``i, j < n``
    (``kk = k[..., h // (H // Hg), :]``)::

        L[i, j] = beta_i <kk_i, kk_j> safe_exp(g_i - g_j)   (i > j, else 0)
        A = (I + L)^-1
        u_i = sum_j A[i, j] beta_j v_j
        w_i = sum_j A[i, j] beta_j exp(g_j) kk_j

    Args:
      k: ``[B, T, Hg, K]`` keys, bfloat16, float16 or float32.
      v: ``[B, T, H, V]`` values, dtype of ``k``; ``H % Hg == 0`` (GQA).
      g: ``[B, T, H]`` cumulative sum of the log forget gates, local to each
        64-chunk, in **natural log** as in the seed (flash-linear-attention 0.6
        keeps log2-space gates: multiply such a ``g`` by ``ln 2`` first).
        Any float dtype; ``None`` means no gate.
      beta: ``[B, T, H]`` write strengths, float (usually float32 or k's dtype).
      cu_seqlens: optional ``[N + 1]`` int32 offsets of a packed batch
        (``B == 1``, ``cu[0] == 0``, non-decreasing, ``cu[-1] == T``). May be
        traced under ``jax.jit``; then its values are not checked (see README).
      chunk_size: 64, the only size the fused kernel supports.
      chunk_indices: optional ``[NT, 2]`` int32 from
        :func:`gdn_jax.prepare_chunk_indices` (computed when omitted).
      impl: ``"auto"``, the fastest path here (float64 inputs: ``"reference"``
        on every backend): on an NVIDIA GPU ``"split"``,
        or ``"triton"`` for small launches (up to 2048 chunk-head programs;
        measured on an H200, see the README), and ``"gluon"`` in place of
        ``"split"`` where it runs (below); else ``"reference"``.
        ``"gluon"``, the warp-specialized Gluon kernel
        (``kernels/gluon_intra.py``: the split path's math in one launch, both
        stages at once on every SM), for Hopper GPUs and jax-triton >= 0.4,
        on fixed-length bfloat16 ``k``/``v`` with ``K = V =
        128`` and ``T % 64 == 0`` (other inputs raise ValueError; ``"auto"``
        runs ``"split"`` for them). ``"triton"``, the one-kernel
        Triton path (``kernels/fused_intra.py``); ``"split"``, that path's
        ``A`` kernel, then the w/u kernel (``kernels/recompute_w_u.py``);
        ``"seed"``, the seed's two Triton kernels (``kernels/kkt_solve.py``
        then the same w/u kernel); ``"reference"``, the jnp reference. Each
        Triton launch runs the config that was fastest for its shapes, timed
        on the first trace (:mod:`gdn_jax.autotune`).

    Returns:
      ``(w, u, A)``: ``w [B, T, H, K]`` in k's dtype, ``u [B, T, H, V]`` in v's
      dtype, ``A [B, T, H, 64]`` in k's dtype, where row ``c0 + i`` holds
      ``A[i, :n]`` of its chunk and zeros after.

    Sharded inputs (under ``jax.jit``) stay sharded over batch and heads: each
    device runs the kernels on its block (:mod:`gdn_jax.sharding`).

    Derivatives: ``jax.grad``, ``jax.vjp`` with respect to ``k``, ``v``,
    ``g`` and ``beta`` on every path; on the Triton paths a ``custom_vjp``
    whose backward runs the WY kernel (:mod:`gdn_jax.intra_bwd`; cotangents
    in the inputs' dtypes), on ``"reference"`` JAX's own. Forward mode
    (``jax.jvp``) works on ``"reference"`` and raises on the Triton paths.
    """
    check_impl("fwd_intra", impl)
    k, v, g, beta, cu_seqlens, chunk_indices = map(
        as_array, (k, v, g, beta, cu_seqlens, chunk_indices))
    check_fwd_intra_args(k, v, g, beta, cu_seqlens, chunk_size, chunk_indices)
    B, T, H = v.shape[:3]
    gluon = impl == "auto" and gluon_fits(k, v, g, beta, cu_seqlens)
    cu_seqlens, chunk_indices = varlen_work_list(cu_seqlens, chunk_indices, T, chunk_size)
    chunks = None if chunk_indices is None else chunk_indices.shape[0]
    path = impl_for(B, T, H, impl, chunks=chunks, chunk_size=chunk_size, gluon=gluon)
    if impl == "auto" and not kernel_dtypes(k, v, g, beta):
        path = "reference"  # float64: the jnp path on every backend (the kernels do not take it)
    if impl == "gluon":
        check_gluon("fwd_intra", k, v, g, beta, cu_seqlens)
    if path == "reference":  # jnp: JAX differentiates it, forward and reverse mode
        return fwd_intra_sharded(k, v, g, beta, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
                                 chunk_indices=chunk_indices, impl=path)
    check_not_forward_mode("fwd_intra", path, (k, v, g, beta))
    # the backward's WY kernel where its tiles fit (not float32 past K = 128), else jnp
    static = IntraStatic(path, chunk_size, walk_kernel_fits(k.dtype, k.shape[3]))
    return fwd_intra_with_vjp(static, k, v, g, beta, cu_seqlens, chunk_indices)
