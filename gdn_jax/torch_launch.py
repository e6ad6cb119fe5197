"""The same ``kernels/`` launched from PyTorch: the second launcher of the Triton
sources, for the CPU interpreter tests (``TRITON_INTERPRET=1`` with torch CPU
tensors) and the JAX-vs-torch benchmark on the GPU. Needs torch (not a
dependency of gdn-jax; the ``interpreter`` extra installs it).
"""
from __future__ import annotations

import numpy as np

from .chunk_indices import cdiv, prepare_chunk_indices
from .kernels.fused_intra import gdn_fwd_intra_A_kernel, gdn_fwd_intra_fused_kernel
from .kernels.kkt_solve import chunk_gated_delta_rule_fwd_kkt_solve_kernel as kkt_solve_kernel
from .kernels.recompute_w_u import recompute_w_u_fwd_kernel
from .autotune import untuned
from .triton_launch import BC, _block, check_seed_triton, head_fastest_grid, wu_blocks


def chunk_indices_torch(cu_seqlens, device, chunk_size=64):
    """:func:`gdn_jax.prepare_chunk_indices` of torch ``cu_seqlens`` as a torch
    int32 tensor on ``device``."""
    import torch

    return torch.from_numpy(np.array(prepare_chunk_indices(cu_seqlens.cpu().numpy(), chunk_size))).to(device)


def tuned_or_fixed(kernel, name: str, autotune: bool, configs=None, key_dim=None):
    """``(kernel, config kwargs)``: the inner ``JITFunction`` with the config
    ``configs[name]`` when given, else the autotuned kernel as it is (Triton's
    own autotuner), or its inner ``JITFunction`` with the fixed config
    (:func:`gdn_jax.autotune.untuned` of a launch of ``key_dim`` key columns)."""
    if configs and name in configs:
        return kernel.fn, configs[name]
    return (kernel, {}) if autotune else (kernel.fn, untuned(name, key_dim=key_dim))


def fwd_intra_torch(k, v, g, beta, cu_seqlens=None, chunk_size=64, chunk_indices=None,
                    *, autotune=True, dot_precision="tf32", path="fused",
                    A_kernel=None, wu_kernel=None, configs=None, sum_g=False):
    """``fwd_intra`` on torch tensors: ``path="gluon"`` the Gluon kernel
    (:func:`fwd_intra_gluon_torch`), ``path="fused"`` the one-kernel path,
    ``path="seed"`` the seed's fused kkt+solve kernel, then w/u; ``path="split"``
    the one-kernel path's A part as its own kernel, then w/u (as the
    ``impl`` values ``"gluon"``, ``"triton"``, ``"seed"`` and ``"split"`` of :func:`gdn_jax.fwd_intra`);
    ``path="A"`` that A kernel alone (``w`` and ``u`` returned unwritten).
    ``configs`` (``{kernel name: config kwargs}``, names as in
    :data:`gdn_jax.autotune.UNTUNED`) pins those kernels' configs, for
    instance to the ones the JAX side's autotuner chose.

    Shapes and dtypes as :func:`gdn_jax.fwd_intra`; ``cu_seqlens`` and
    ``chunk_indices`` are torch integer tensors (``chunk_indices`` computed
    from ``cu_seqlens`` when omitted). ``autotune=False`` calls the inner
    ``JITFunction`` with a fixed config, which the interpreter needs.
    ``A_kernel`` replaces the path's kernel that builds ``A`` (kkt_solve, the
    one kernel, or the split's A kernel; benchmarks of variants), ``wu_kernel``
    the w/u kernel of the two-kernel paths. ``sum_g`` (path ``"A"`` only):
    ``g`` holds the per-step log gates ``[B, T, H]`` float32, which the A
    kernel sums within each chunk (``SUM_G``); the split path's w/u kernel
    reads cumulative gates, so it takes none.
    """
    import torch

    if sum_g and path != "A":
        raise ValueError(f"fwd_intra_torch: sum_g is the A kernel's alone (path 'A'), not path {path!r}'s")
    if path == "gluon":  # fixed length only (gluon_launch.input_mismatch)
        return fwd_intra_gluon_torch(k, v, g, beta)
    if path == "seed":
        check_seed_triton("fwd_intra_torch")
    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = chunk_indices_torch(cu_seqlens, k.device, BT)
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
    if path in ("split", "A"):
        first, config = tuned_or_fixed(A_kernel or gdn_fwd_intra_A_kernel, "A", autotune, configs)
        first[grid](k=k, A=A, BC=BC, SUM_G=sum_g, **common, **config)
        if path == "A":  # A alone, for the walk that forms v' from it (w, u left unwritten)
            return w, u, A
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


def chunk_qk_torch(q, k, gc, cu_seqlens=None, *, autotune=True, dot_precision="tf32", config=None,
                   sum_g=False):
    """``Aqk [B, T, H, 64]`` (``kernels/chunk_qk.py``) on torch tensors, as
    :func:`gdn_jax.chunk_launch.chunk_qk_triton` (the chunk list of a packed
    batch computed from ``cu_seqlens``); ``config`` (kwargs) pins the config;
    ``sum_g``: ``gc`` holds the per-step log gates, summed in the kernel (``SUM_G``)."""
    import torch

    from .chunk_launch import chunk_qk_block
    from .kernels.chunk_qk import gdn_chunk_qk_kernel

    B, T, Hg, K = k.shape
    H = gc.shape[2]
    dev = k.device
    varlen = cu_seqlens is not None
    dummy = torch.zeros(1, dtype=torch.int32, device=dev)
    ci = chunk_indices_torch(cu_seqlens, dev) if varlen else dummy
    Aqk = torch.empty(B, T, H, 64, device=dev, dtype=q.dtype)
    kernel, kwargs = tuned_or_fixed(gdn_chunk_qk_kernel, "chunk_qk", autotune,
                                    None if config is None else {"chunk_qk": config})
    kernel[head_fastest_grid(len(ci) if varlen else cdiv(T, 64), Hg, B)](
        q, k, gc, dummy if not varlen else cu_seqlens.to(torch.int32), ci, T, Aqk, H=H, Hg=Hg, K=K, BT=64,
        BK=chunk_qk_block(K), IS_VARLEN=varlen, DOT_PRECISION=dot_precision, SUM_G=sum_g,
        **kwargs)
    return Aqk


def fwd_intra_A_qk_torch(q, k, g, beta, cu_seqlens=None, *, autotune=True, dot_precision="tf32",
                         config=None):
    """``(A, Aqk)``, each ``[B, T, H, 64]`` in k's dtype, from one launch of
    ``kernels/fused_intra.py``'s ``gdn_fwd_intra_A_qk_kernel`` (an experiment:
    ``A`` as :func:`fwd_intra_torch` ``path="A"`` and the output block as
    :func:`chunk_qk_torch`, both from one kernel). ``q, k [B, T, Hg, K]``,
    ``g [B, T, H]`` float32 chunk-local cumulative log gates, ``beta [B, T,
    H]`` float32; ``config`` (kwargs) pins the config, else Triton's
    autotuner runs (``autotune=True``) or the split's A kernel's fixed config."""
    import torch

    from .kernels.fused_intra import gdn_fwd_intra_A_qk_kernel

    B, T, Hg, K = k.shape
    H = g.shape[2]
    varlen = cu_seqlens is not None
    dev = k.device
    dummy = torch.zeros(1, dtype=torch.int32, device=dev)
    ci = chunk_indices_torch(cu_seqlens, dev) if varlen else dummy
    A = torch.empty(B, T, H, 64, device=dev, dtype=k.dtype)
    Aqk = torch.empty_like(A)
    NT = len(ci) if varlen else cdiv(T, 64)
    if NT * B * H == 0:
        return A, Aqk
    kernel, kwargs = tuned_or_fixed(gdn_fwd_intra_A_qk_kernel, "A", autotune,
                                    None if config is None else {"A": config})
    kernel[head_fastest_grid(NT, H, B)](
        q, k, g, beta, dummy if not varlen else cu_seqlens.to(torch.int32), ci, T, A, Aqk, H=H, Hg=Hg,
        K=K, BT=64, BC=BC, USE_G=True, IS_VARLEN=varlen, DOT_PRECISION=dot_precision, **kwargs)
    return A, Aqk


def chunk_fwd_torch(q, k, w, u, gc, initial_state=None, cu_seqlens=None, *, scale,
                    output_final_state=True, state_v_first=False, write_o=True, store_h=False,
                    store_v=False, autotune=True, config=None, dot_precision="tf32", beta=None, sum_g=False):
    """The chunk walk (``kernels/chunk_fwd.py``) on torch tensors: ``(o,
    final_state, h, v_new)`` as :func:`gdn_jax.chunk_launch.chunk_walk_triton`,
    each None where not asked for; with ``beta`` (float32), ``w`` is ``A`` and
    ``u`` is ``v`` (``FROM_A``), after :func:`chunk_qk_torch` (with ``write_o``).
    ``config`` (kwargs) pins the config, else Triton's autotuner runs
    (``autotune=True``) or the fixed config (interpreter). ``sum_g``: ``gc``
    holds the per-step log gates ``[B, T, H]`` float32, which the walk (and
    chunk_qk) sum within each chunk (``SUM_G``)."""
    import torch

    from .chunk_indices import chunk_offsets
    from .chunk_launch import chunk_fwd_constexprs, chunk_fwd_grid, state_rows
    from .kernels.chunk_fwd import gdn_chunk_fwd_kernel

    B, T, Hg, K = k.shape
    H, V = u.shape[2], u.shape[3]
    varlen = cu_seqlens is not None
    N = B if not varlen else len(cu_seqlens) - 1
    dev = u.device
    empty = lambda shape, dtype, want: torch.empty(shape if want else (1,), device=dev, dtype=dtype)  # noqa: E731
    o = empty((B, T, H, V), u.dtype, write_o)
    ht = empty((N, H, V, K) if state_v_first else (N, H, K, V), torch.float32, output_final_state)
    h = empty((state_rows(B, T, N, varlen), H, K, V), u.dtype, store_h)
    vn = empty((B, T, H, V), u.dtype, store_v)
    outs = [o, ht, h, vn]
    wanted = (write_o, output_final_state, store_h, store_v)
    if N * H != 0:
        dummy = torch.zeros(1, dtype=torch.int32, device=dev)
        offsets = dummy
        if varlen:
            offsets = torch.from_numpy(np.array(chunk_offsets(cu_seqlens.cpu().numpy()))).to(dev)
        kernel, kwargs = tuned_or_fixed(gdn_chunk_fwd_kernel, "chunk_fwd", autotune,
                                        None if config is None else {"chunk_fwd": config})
        grid = lambda meta: chunk_fwd_grid(N, H, V, meta["BV"])  # noqa: E731
        qk = dummy
        if beta is not None and write_o:
            qk = chunk_qk_torch(q, k, gc, cu_seqlens, autotune=autotune, dot_precision=dot_precision,
                                sum_g=sum_g)
        kernel[grid](q, k, w, u, gc, dummy if beta is None else beta.float(), qk,
                     dummy if initial_state is None else initial_state.float(),
                     dummy if cu_seqlens is None else cu_seqlens.to(torch.int32), offsets,
                     float(scale), T, o, ht, h, vn,
                     **chunk_fwd_constexprs(Hg, H, K, V, initial_state is not None, output_final_state,
                                            varlen, state_v_first, dot_precision),
                     WRITE_O=write_o, STORE_H=store_h, STORE_V=store_v, FROM_A=beta is not None,
                     SUM_G=sum_g, **kwargs)
    return tuple(x if want else None for x, want in zip(outs, wanted))


def chunk_bwd_torch(q, k, v, gc, beta, A, initial_state, do, dht, cu_seqlens=None, *, scale,
                    dot_precision="tf32", config=None, configs=None, qk_in=True, from_A=True):
    """The backward of the chunked forward from the Triton kernels on torch
    tensors (the interpreter tests' launch of the whole pipeline):
    ``(dq, dk, dv, da, dbeta, dh0)`` as
    :func:`gdn_jax.chunk_bwd_launch.chunk_bwd_triton` (``da``: the per-step
    gates' cotangent, from the WY kernel).
    The steps, as :func:`gdn_jax.chunk_bwd_launch.chunk_bwd_triton`: the walk
    from ``A`` again storing the chunk states and ``v'``, the output block
    (``chunk_qk``), the reverse walk, the per-chunk gradients, the WY
    backward; then the sums over value heads (torch).
    ``qk_in=False`` has the reverse walk form ``q k^T`` itself, ``from_A=False``
    rebuilds ``w, u`` (``recompute_w_u``) for both walks (the kernels' other
    forms, for tests and the probe).
    ``config``: the recompute walk's config; ``configs`` (``{kernel name:
    config kwargs}``, names as in :data:`gdn_jax.autotune.UNTUNED`, Triton
    launch options such as ``maxnreg`` included, and ``BV`` of the per-chunk
    and WY kernels, else :func:`~gdn_jax.chunk_bwd_launch.value_blocks`, and
    ``BK`` of the per-chunk kernel, else 64) pins the other kernels'."""
    import torch

    from .chunk_bwd_launch import _pow2, partials_in_input_dtype, value_blocks
    from .chunk_indices import chunk_offsets
    from .kernels.chunk_bwd_local import gdn_chunk_bwd_local_kernel
    from .kernels.chunk_bwd_walk import gdn_chunk_bwd_walk_kernel

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    varlen = cu_seqlens is not None
    N = B if not varlen else len(cu_seqlens) - 1
    dev = k.device
    dummy = torch.zeros(1, dtype=torch.int32, device=dev)
    cu = dummy if not varlen else cu_seqlens.to(torch.int32)
    ci = chunk_indices_torch(cu_seqlens, dev) if varlen else dummy
    offsets = torch.from_numpy(np.array(chunk_offsets(cu_seqlens.cpu().numpy()))).to(dev) \
        if varlen else dummy
    NT = cdiv(T, 64) if not varlen else len(ci)
    grid = head_fastest_grid(NT, H, B)
    if from_A:  # both walks read A (w's place) with beta; v is u's place
        w, u, beta_w = A, v, beta.float()
    else:  # w, u from the saved A (the split path's second kernel)
        w = torch.empty(B, T, H, K, device=dev, dtype=k.dtype)
        u = torch.empty(B, T, H, V, device=dev, dtype=v.dtype)
        common = dict(T=T, H=H, Hg=Hg, K=K, BT=64, USE_G=True, IS_VARLEN=varlen, DOT_PRECISION=dot_precision)
        wu, wu_config = tuned_or_fixed(recompute_w_u_fwd_kernel, "recompute_w_u", False, configs)
        wu[grid](k=k, v=v, beta=beta, g=gc, A=A, cu_seqlens=cu, chunk_indices=ci, w=w, u=u, V=V,
                 **wu_blocks(K, V), **common, **wu_config)
        beta_w = None
    _, _, h, vn = chunk_fwd_torch(k, k, w, u, gc, initial_state, cu_seqlens, scale=scale,
                                  output_final_state=False, write_o=False, store_h=True, store_v=True,
                                  autotune=False, config=config, dot_precision=dot_precision, beta=beta_w)
    qk = chunk_qk_torch(q, k, gc, cu_seqlens, autotune=False, dot_precision=dot_precision,
                        config=(configs or {}).get("chunk_qk")) if qk_in else dummy
    dv_new = torch.empty(B, T, H, V, device=dev, dtype=k.dtype)  # as chunk_bwd_launch: read rounded to k's dtype
    dh = torch.empty_like(h)
    dh0 = torch.empty(N, H, K, V, device=dev, dtype=torch.float32)
    walk, walk_config = tuned_or_fixed(gdn_chunk_bwd_walk_kernel, "chunk_bwd_walk", False, configs)
    from .chunk_launch import chunk_fwd_grid

    BK = _pow2(K)
    walk[chunk_fwd_grid(N, H, V, walk_config["BV"])](
        q, k, w, dummy if beta_w is None else beta_w, gc, do, qk, dummy if dht is None else dht.float(), cu,
        offsets, float(scale), T,
        dv_new, dh, dh0, H=H, Hg=Hg, K=K, V=V, BT=64, BK=BK, USE_DHT=dht is not None,
        IS_VARLEN=varlen, DOT_PRECISION=dot_precision, QK_IN=qk_in, FROM_A=from_A, **walk_config)
    local, local_config = tuned_or_fixed(gdn_chunk_bwd_local_kernel, "chunk_bwd_local", False, configs)
    local_config = dict(local_config)
    BKl = local_config.pop("BK", min(64, BK))
    NK = cdiv(K, BKl)
    BVl, _, v_stages = value_blocks(K, V, k.element_size())  # as chunk_bwd_launch
    part = k.dtype if partials_in_input_dtype(str(k.dtype).removeprefix("torch.")) else torch.float32
    dq = torch.empty(B, T, H, K, device=dev, dtype=part)
    dk = torch.empty_like(dq)
    dw = torch.empty(B, T, H, K, device=dev, dtype=k.dtype)
    dg = torch.zeros(NK, B, T, H, device=dev, dtype=torch.float32)
    local[(NT * H * NK, B)](
        q, k, vn, gc, do, dv_new, h, dh, cu, ci, float(scale), T, dq, dk, dw, dg, H=H, Hg=Hg, K=K,
        V=V, BT=64, BK=BKl, IS_VARLEN=varlen, DOT_PRECISION=dot_precision,
        **{"BV": BVl, "V_STAGES": v_stages, **local_config})
    dk_wy, dv, dbeta, da = wy_bwd_torch(k, v, beta, gc, A, dw, dv_new, None, cu_seqlens,
                                        dot_precision=dot_precision, configs=configs, dgc_shares=dg)
    heads = lambda x: x.float().view(B, T, Hg, H // Hg, K).sum(3)  # noqa: E731  GQA, in float32
    return heads(dq), heads(dk.float() + dk_wy), dv, da, dbeta, dh0


def wy_bwd_torch(k, v, beta, gc, A, dw, du, dA=None, cu_seqlens=None, *, dot_precision="tf32",
                 configs=None, dgc_shares=None):
    """``(dk, dv, dbeta, dgc)`` of the WY kernel on torch tensors, as
    :func:`gdn_jax.chunk_bwd_launch.wy_bwd_launch` (``dk`` per value head;
    ``dgc_shares`` given: ``da`` last; ``configs`` as :func:`chunk_bwd_torch`'s)."""
    import torch

    from .chunk_bwd_launch import _pow2, partials_in_input_dtype, value_blocks
    from .kernels.wy_bwd import gdn_wy_bwd_kernel

    B, T, Hg, K = k.shape
    H, V = v.shape[2], v.shape[3]
    varlen = cu_seqlens is not None
    dev = k.device
    dummy = torch.zeros(1, dtype=torch.int32, device=dev)
    ci = chunk_indices_torch(cu_seqlens, dev) if varlen else dummy
    NT = cdiv(T, 64) if not varlen else len(ci)
    _, BVw, v_stages = value_blocks(K, V, k.element_size())
    part = k.dtype if partials_in_input_dtype(str(k.dtype).removeprefix("torch.")) else torch.float32
    dk = torch.empty(B, T, H, K, device=dev, dtype=part)
    dv = torch.empty(B, T, H, V, device=dev, dtype=torch.float32)
    dbeta = torch.zeros(B, T, H, device=dev, dtype=torch.float32)
    dg = torch.zeros(B, T, H, device=dev, dtype=torch.float32)
    wy, wy_config = tuned_or_fixed(gdn_wy_bwd_kernel, "wy_bwd", False, configs, key_dim=K)
    wy[head_fastest_grid(NT, H, B)](
        k, v, beta, gc, A, dw, du, dummy if dA is None else dA,
        torch.zeros(1, device=dev) if dgc_shares is None else dgc_shares,
        dummy if not varlen else cu_seqlens.to(torch.int32), ci, T, dk, dv, dbeta, dg, H=H, Hg=Hg, K=K,
        V=V, BT=64, BK=_pow2(K), IS_VARLEN=varlen, DOT_PRECISION=dot_precision, DA_IN=dA is not None,
        NK_IN=0 if dgc_shares is None else dgc_shares.shape[0], REV_CUMSUM=dgc_shares is not None,
        **{"BV": BVw, "V_STAGES": v_stages, **wy_config})
    return dk, dv, dbeta, dg


def fused_recurrent_torch(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None,
                          cu_seqlens=None, state_indices=None, *, scale=None,
                          output_final_state=True, state_v_first=False,
                          use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                          use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                          autotune=True, config=None):
    """The per-token recurrence (``kernels/fused_recurrent.py``) on torch
    tensors: ``(o [B, T, H, V] in v's dtype, final state or None)``. Shapes
    and options as :func:`gdn_jax.fused_recurrent_gated_delta_rule`, the
    indices taken as given (the kernel skips those outside ``[0, P)``; give
    :func:`gdn_jax.fused_recurrent.owned_state_indices` of repeated ones).
    With ``initial_state`` and ``output_final_state`` the state is written in
    place and returned; ``config`` (kwargs) pins the config, else Triton's
    autotuner runs (``autotune=True``) or the fixed config (interpreter)."""
    import torch

    from .fused_recurrent_launch import fused_recurrent_constexprs, fused_recurrent_grid
    from .kernels.fused_recurrent import gdn_fused_recurrent_kernel

    B, T, Hg, K = q.shape
    H, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    scale = K ** -0.5 if scale is None else scale
    use_h0 = initial_state is not None
    in_place = use_h0 and output_final_state
    o = torch.empty(B, T, H, V, device=v.device, dtype=v.dtype)
    shape = (N, H, V, K) if state_v_first else (N, H, K, V)
    fresh = output_final_state and not use_h0
    ht = torch.empty(shape if fresh else (1,), device=v.device, dtype=torch.float32)
    final = initial_state if in_place else (ht if fresh else None)
    if N * H == 0 or B * T == 0:
        return o.zero_(), (ht.zero_() if fresh else final)
    dummy = torch.zeros(1, dtype=torch.int32, device=v.device)
    kernel, kwargs = tuned_or_fixed(gdn_fused_recurrent_kernel, "fused_recurrent", autotune,
                                    None if config is None else {"fused_recurrent": config})
    grid = lambda meta: fused_recurrent_grid(N, H, V, meta["BV"])  # noqa: E731
    arrays = [dummy if x is None else x for x in
              (q, k, v, g, beta, A_log, dt_bias, cu_seqlens, state_indices, initial_state)]
    if cu_seqlens is not None:
        arrays[7] = cu_seqlens.to(torch.int32)
    if state_indices is not None:
        arrays[8] = state_indices.to(torch.int32)
    kernel[grid](*arrays, float(scale), T, initial_state.shape[0] if use_h0 else N, o, ht,
                 **fused_recurrent_constexprs(
                     Hg, H, K, V, use_h0=use_h0, store_final=output_final_state, in_place=in_place,
                     varlen=cu_seqlens is not None, pool=state_indices is not None,
                     v_first=state_v_first, l2norm_q=use_qk_l2norm_in_kernel,
                     l2norm_k=use_qk_l2norm_in_kernel, gate=use_gate_in_kernel,
                     dt_bias=dt_bias is not None, beta_sigmoid=use_beta_sigmoid_in_kernel,
                     neg_eigval=allow_neg_eigval),
                 **kwargs)
    return o, final
