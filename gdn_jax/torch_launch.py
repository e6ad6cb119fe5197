"""The same ``kernels/`` launched from PyTorch: the second launcher of the Triton
sources, for the CPU interpreter tests (``TRITON_INTERPRET=1`` with torch CPU
tensors) and the JAX-vs-torch benchmark on the GPU. Needs torch (not a
dependency of gdn-jax; the ``test`` extra installs it).
"""
from __future__ import annotations

import numpy as np

from .chunk_indices import cdiv, prepare_chunk_indices
from .kernels.fused_intra import gdn_fwd_intra_A_kernel, gdn_fwd_intra_fused_kernel
from .kernels.kkt_solve import chunk_gated_delta_rule_fwd_kkt_solve_kernel as kkt_solve_kernel
from .kernels.recompute_w_u import recompute_w_u_fwd_kernel
from .autotune import UNTUNED
from .triton_launch import BC, _block, check_seed_triton, head_fastest_grid, wu_blocks


def tuned_or_fixed(kernel, name: str, autotune: bool, configs=None):
    """``(kernel, config kwargs)``: the inner ``JITFunction`` with the config
    ``configs[name]`` when given, else the autotuned kernel as it is (Triton's
    own autotuner), or its inner ``JITFunction`` with the fixed config ``UNTUNED[name]``."""
    if configs and name in configs:
        return kernel.fn, configs[name]
    return (kernel, {}) if autotune else (kernel.fn, UNTUNED[name])


def fwd_intra_torch(k, v, g, beta, cu_seqlens=None, chunk_size=64, chunk_indices=None,
                    *, autotune=True, dot_precision="tf32", path="fused",
                    A_kernel=None, wu_kernel=None, configs=None):
    """``fwd_intra`` on torch tensors: ``path="gluon"`` the Gluon kernel
    (:func:`fwd_intra_gluon_torch`), ``path="fused"`` the one-kernel path,
    ``path="seed"`` the seed's fused kkt+solve kernel, then w/u; ``path="split"``
    the one-kernel path's A part as its own kernel, then w/u (as the
    ``impl`` values ``"gluon"``, ``"triton"``, ``"seed"`` and ``"split"`` of :func:`gdn_jax.fwd_intra`).
    ``configs`` (``{kernel name: config kwargs}``, names as in
    :data:`gdn_jax.autotune.UNTUNED`) pins those kernels' configs, for
    instance to the ones the JAX side's autotuner chose.

    Shapes and dtypes as :func:`gdn_jax.fwd_intra`; ``cu_seqlens`` and
    ``chunk_indices`` are torch integer tensors (``chunk_indices`` computed
    from ``cu_seqlens`` when omitted). ``autotune=False`` calls the inner
    ``JITFunction`` with a fixed config, which the interpreter needs.
    ``A_kernel`` replaces the path's kernel that builds ``A`` (kkt_solve, the
    one kernel, or the split's A kernel; benchmarks of variants), ``wu_kernel``
    the w/u kernel of the two-kernel paths.
    """
    import torch

    if path == "gluon":  # fixed length only (gluon_launch.input_mismatch)
        return fwd_intra_gluon_torch(k, v, g, beta)
    if path == "seed":
        check_seed_triton("fwd_intra_torch")
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if cu_seqlens is not None and chunk_indices is None:
        ci = np.array(prepare_chunk_indices(cu_seqlens.cpu().numpy(), BT))
        chunk_indices = torch.from_numpy(ci).to(k.device)
    NT = cdiv(T, BT) if cu_seqlens is None else len(chunk_indices)
    # the seed's kkt_solve writes the lower blocks only; the other paths store A whole
    A = (torch.zeros if path == "seed" else torch.empty)(B, T, H, BT, device=k.device, dtype=k.dtype)
    w = torch.empty(B, T, H, K, device=k.device, dtype=k.dtype)
    u = torch.empty(B, T, H, V, device=k.device, dtype=v.dtype)
    if NT == 0 or B * H == 0:
        return w, u, A
    dummy = torch.zeros(1, dtype=torch.int32, device=k.device)
    common = dict(
        g=dummy if g is None else g,
        beta=beta,
        cu_seqlens=dummy if cu_seqlens is None else cu_seqlens.to(torch.int32),
        chunk_indices=dummy if chunk_indices is None else chunk_indices.to(torch.int32),
        T=T, H=H, Hg=Hg, K=K, BT=BT,
        USE_G=g is not None, IS_VARLEN=cu_seqlens is not None, DOT_PRECISION=dot_precision,
    )
    grid = head_fastest_grid(NT, H, B)  # every kernel but the seed's kkt_solve
    if path == "fused":
        fused, config = tuned_or_fixed(A_kernel or gdn_fwd_intra_fused_kernel, "fused", autotune, configs)
        fused[grid](k=k, v=v, w=w, u=u, A=A, V=V, BC=BC, BV=_block(V), **common, **config)
        return w, u, A
    if path == "split":
        first, config = tuned_or_fixed(A_kernel or gdn_fwd_intra_A_kernel, "A", autotune, configs)
        first[grid](k=k, A=A, BC=BC, **common, **config)
    else:
        kkt, config = tuned_or_fixed(A_kernel or kkt_solve_kernel, "kkt_solve", autotune, configs)
        kkt[(NT, H, B)](k=k, A=A, BC=BC, **common, **config)  # the seed's chunk-major grid
    wu, config = tuned_or_fixed(wu_kernel or recompute_w_u_fwd_kernel, "recompute_w_u", autotune, configs)
    wu[grid](k=k, v=v, A=A, w=w, u=u, V=V, **wu_blocks(K, V), **common, **config)
    return w, u, A


def fwd_intra_gluon_torch(k, v, g, beta, **overrides):
    """``(w, u, A)`` by the Gluon kernel (``kernels/gluon_intra.py``) on torch
    CUDA tensors: bfloat16 ``k``/``v`` with ``K = V = 128``, float32 ``g``
    and ``beta``, fixed length (:func:`gdn_jax.gluon_launch.input_mismatch`).
    ``overrides`` as :func:`gdn_jax.gluon_launch.launch_args`. Makes the TMA
    descriptors (in Python, on every call: 0.1 to 0.2 ms of host time)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .gluon_launch import WARPS, launch_args, rows_mismatch, tile_layout
    from .kernels.gluon_intra import gdn_fwd_intra_gluon_kernel

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    n_sm = torch.cuda.get_device_properties(k.device).multi_processor_count
    grid, scalars, constexprs, maxnreg = launch_args(B, T, Hg, H, K, V, n_sm, **overrides)
    mismatch = rows_mismatch(B, T, constexprs["TMA"])
    if mismatch:
        raise ValueError(f"fwd_intra_gluon_torch: with TMA, {mismatch}")
    w = torch.empty(B, T, H, K, device=k.device, dtype=k.dtype)
    u = torch.empty(B, T, H, V, device=k.device, dtype=v.dtype)
    A = torch.empty(B, T, H, 64, device=k.device, dtype=k.dtype)
    descs = (k, v, w, u)  # unused pointers without TMA
    if constexprs["TMA"]:
        descs = [TensorDescriptor.from_tensor(x.view(B * T, -1), [64, cols], tile_layout())
                 for x, cols in ((k, K), (v, V), (w, 64), (u, 64))]
    gdn_fwd_intra_gluon_kernel[grid](k, v, g, beta, *descs, *scalars, w, u, A, **constexprs, num_warps=WARPS,
                                     maxnreg=maxnreg)
    return w, u, A
