"""Stand-ins for the Triton launches on a machine without a GPU: the jnp
references behind the same interfaces, refusing ``jax.vmap`` as jax-triton's
launch does, so that the JAX glue around the kernels (vmap folding,
``custom_vjp``, sharding rules) is tested on CPU. Fixtures, registered in
conftest.py."""
import jax
import jax.numpy as jnp
import pytest

import gdn_jax
from gdn_jax import backend, sharding
from gdn_jax.chunk_jnp import chunk_local_cumsum
from gdn_jax.reference import fwd_intra_jnp


def unbatchable(fwd):
    """``fwd``, raising under ``jax.vmap`` (as ``jax_triton.triton_call`` does)."""
    def run(*args, **kwargs):
        leaves, tree = jax.tree.flatten((args, kwargs))
        arrays = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]

        @jax.custom_batching.custom_vmap
        def call(*arrs):
            full = list(leaves)
            for i, a in zip(arrays, arrs):
                full[i] = a
            a, kw = jax.tree.unflatten(tree, full)
            return fwd(*a, **kw)

        @call.def_vmap
        def refuse(*_):
            raise NotImplementedError("no batching rule, as in jax-triton")

        return call(*(leaves[i] for i in arrays))
    return run


def doubling_solve(a, b, *, lower=True, unit_diagonal=True):
    """``(I + L)^-1 b`` for unit lower triangular ``a = I + L`` by matmuls,
    ``(I - L)(I + L^2)(I + L^4)...`` (``L`` is nilpotent), for
    ``gdn_jax.reference.solve_triangular``: jaxlib's batched CPU LAPACK solve
    blocks in the intra-op thread pool and can deadlock where several run at
    once (independent solves in one jit, or as many virtual devices as pool
    threads: tests/sharding_cases.py); differentiable."""
    assert lower and unit_diagonal
    n = a.shape[-1]
    eye = jnp.eye(n, dtype=a.dtype)
    L = a - eye
    inv, power = eye - L, L
    for _ in range(max(n - 1, 1).bit_length() - 1):
        power = power @ power
        inv = inv @ (eye + power)
    return inv @ b


@pytest.fixture
def solve_by_matmuls(monkeypatch):
    """The reference's triangular solve by :func:`doubling_solve`."""
    import gdn_jax.reference

    monkeypatch.setattr(gdn_jax.reference, "solve_triangular", doubling_solve)


def intra_launch(k, v, g, beta, *, cu_seqlens, chunk_size, chunk_indices, path, sum_g=False):
    """``fwd_intra``'s Triton launch, by the jnp reference (path "A": ``(A,)``;
    ``sum_g``: ``g`` holds the per-step gates, summed here as the kernel does)."""
    if sum_g:
        assert path == "A", "the A kernel alone sums the gates"
        g = chunk_local_cumsum(g, cu_seqlens, chunk_indices)
    w, u, A = fwd_intra_jnp(k, v, g, beta, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
                            chunk_indices=chunk_indices)
    return (A,) if path == "A" else (w, u, A)


def qk_block(q, k, gc, cu):
    """The output's block of ``kernels/chunk_qk.py`` in jnp: ``[B, T, H, 64]``
    in q's dtype, ``[i, j] = (q_i . k_j) exp(gc_i - gc_j)`` for ``j <= i`` of
    each chunk, zeros elsewhere."""
    from gdn_jax.chunk_jnp import chunk_layout
    from gdn_jax.naive_recurrent import repeat_heads

    B, T, H = gc.shape
    ci = None if cu is None else gdn_jax.chunk_indices.chunk_indices_in_graph(cu, T)
    gather, scatter, valid, _ = chunk_layout(B, T, cu, ci)
    qq, kk = (repeat_heads(gather(x.astype(jnp.float32)), H) for x in (q, k))  # [L, M, BT, H, K]
    g = gather(gc)  # [L, M, BT, H]
    causal = jnp.tril(jnp.ones((64, 64), bool)) & valid[..., :, None] & valid[..., None, :]  # [L, M, i, j]
    diff = g[..., :, :, None] - jnp.swapaxes(g, -1, -2)[..., None, :, :]  # [L, M, i, H, j]
    a = jnp.einsum("lmihk,lmjhk->lmihj", qq, kk, precision=jax.lax.Precision.HIGHEST)
    a = jnp.where(causal[..., :, None, :], a * jnp.exp(jnp.where(causal[..., :, None, :], diff, 0)), 0)
    return scatter(a).astype(q.dtype)


def chunk_states(k, w, u, gc, h0, dtype):
    """The state entering every chunk ``[B, NT, H, K, V]`` and ``v' [B, T, H,
    V]`` of a fixed-length walk in jnp, in ``dtype`` (v's: as the kernel stores them)."""
    from gdn_jax.chunk_jnp import chunk_layout, chunk_states_jnp
    from gdn_jax.naive_recurrent import repeat_heads

    B, T, H = u.shape[:3]
    gather, scatter, valid, seq = chunk_layout(B, T, None, None)
    f32 = lambda x: gather(x.astype(jnp.float32))  # noqa: E731
    S_in, v_new, _ = chunk_states_jnp(repeat_heads(f32(k), H), f32(w), f32(u), f32(gc), valid, seq,
                                      h0.astype(jnp.float32))
    return jnp.swapaxes(S_in, 0, 1).astype(dtype), scatter(v_new).astype(dtype)


def walk_launch(q, k, w, u, gc, h0, cu, *, scale, output_final_state, state_v_first, beta=None,
                chunk_indices=None, return_qk=False, return_states=False, sum_g=False):
    """The chunk walk's Triton launch, by the jnp walk. From ``A, v, beta``
    (``beta`` given): ``w, u`` by the jnp ``fwd_intra``, whose ``A`` the
    launch was given, on the chunk list the launch was given when packed;
    ``return_qk``: with the output's block (:func:`qk_block`);
    ``return_states``: with the chunk states and ``v'`` (:func:`chunk_states`);
    ``sum_g``: ``gc`` holds the per-step gates, summed here as the kernels do."""
    from gdn_jax.chunk_jnp import chunk_walk_jnp

    assert not (return_states and cu is not None), "stored states: fixed length only"
    if sum_g:
        assert (cu is None) == (chunk_indices is None), "a packed walk takes its chunk list"
        gc = chunk_local_cumsum(gc, cu, chunk_indices)
    qk = qk_block(q, k, gc, cu) if return_qk else None
    dtype = u.dtype

    if beta is not None:
        assert (cu is None) == (chunk_indices is None), "a packed walk from A takes its chunk list"
        w, u, _ = fwd_intra_jnp(k, u, gc, beta, cu_seqlens=cu, chunk_indices=chunk_indices)
    B, H, Kd, Vd = u.shape[0], u.shape[2], q.shape[3], u.shape[3]
    N = B if cu is None else cu.shape[0] - 1
    h0 = jnp.zeros((N, H, Kd, Vd), jnp.float32) if h0 is None else h0
    swap = (lambda x: jnp.swapaxes(x, -1, -2)) if state_v_first else (lambda x: x)  # noqa: E731
    ci = None if cu is None else gdn_jax.chunk_indices.chunk_indices_in_graph(cu, u.shape[1])
    o, final = chunk_walk_jnp(q, k, w, u, gc, swap(h0), cu, ci, scale=scale)
    states = chunk_states(k, w, u, gc, swap(h0), dtype) if return_states else ()
    return (o, swap(final)) + ((qk,) if return_qk else ()) + states


def bwd_launch(q, k, v, gc, beta, A, h0, do, dht, cu, ci, *, scale, qk=None, h=None, v_new=None):
    """The backward kernels' launch, by the jnp backward; a given ``qk`` (the
    forward's block) must be this block's (:func:`qk_block` of these ``q, k,
    gc``), and given ``h, v_new`` (the forward's chunk states and ``v'``)
    these inputs' (:func:`chunk_states`), else every gradient is NaN: a
    residual that reached the backward misplaced (sharding, vmap) fails the tests."""
    from gdn_jax.chunk_bwd_jnp import chunk_bwd_per_step_jnp

    grads = chunk_bwd_per_step_jnp(q, k, v, gc, beta, A, h0, do, dht, cu, ci, scale=scale)
    close = lambda x, y: jnp.allclose(x.astype(jnp.float32), y.astype(jnp.float32), rtol=1e-2, atol=1e-2)  # noqa: E731
    ok = True
    if qk is not None:
        ok = close(qk, qk_block(q, k, gc, cu))
    if h is not None:
        B, H, Kd, Vd = v.shape[0], v.shape[2], k.shape[3], v.shape[3]
        w, u, _ = fwd_intra_jnp(k, v, gc, beta)
        h_ref, v_ref = chunk_states(k, w, u, gc, jnp.zeros((B, H, Kd, Vd), jnp.float32) if h0 is None else h0,
                                    v.dtype)
        ok = ok & close(h, h_ref) & close(v_new, v_ref)
    return tuple(jnp.where(ok, x, jnp.nan) for x in grads)


def gpu_path_on_this_cpu():
    """For the subprocess cases (tests/sharding_cases.py,
    tests/context_parallel_cases.py): a GPU reported and every launch of the
    GPU path (fwd_intra, the walk, the backward) replaced by its jnp
    stand-in, refusing batched inputs as jax-triton does."""
    from gdn_jax import chunk_bwd, chunk_walk, intra_bwd

    backend.cuda_available = lambda: True
    sharding.fwd_intra_triton = unbatchable(intra_launch)
    intra_bwd.intra_bwd_triton = unbatchable(intra_bwd.intra_bwd_jnp)
    chunk_walk.chunk_fwd_triton = unbatchable(walk_launch)
    chunk_bwd.chunk_bwd_triton = unbatchable(bwd_launch)


@pytest.fixture
def triton_launch_as_reference(monkeypatch):
    """``fwd_intra``'s Triton paths on this CPU: a GPU reported, and the
    launches (forward and the WY backward of its derivative) replaced by the
    jnp forms, refusing batched inputs as jax-triton does."""
    from gdn_jax import intra_bwd

    monkeypatch.setattr(backend, "cuda_available", lambda: True)
    monkeypatch.setattr(sharding, "fwd_intra_triton", unbatchable(intra_launch))
    monkeypatch.setattr(intra_bwd, "intra_bwd_triton", unbatchable(intra_bwd.intra_bwd_jnp))
    sharding._triton_op.cache_clear()
    intra_bwd._triton_op.cache_clear()
    yield
    sharding._triton_op.cache_clear()
    intra_bwd._triton_op.cache_clear()


@pytest.fixture
def chunk_kernel_as_reference(triton_launch_as_reference, monkeypatch):
    """The whole forward's Triton path on this CPU: fwd_intra's launch as above,
    and the chunk walk's launch replaced by the jnp walk, refusing batched
    inputs as jax-triton does."""
    from gdn_jax import chunk_walk

    monkeypatch.setattr(chunk_walk, "chunk_fwd_triton", unbatchable(walk_launch))
    chunk_walk._triton_op.cache_clear()
    yield
    chunk_walk._triton_op.cache_clear()


@pytest.fixture
def gpu_path_as_reference(chunk_kernel_as_reference, monkeypatch):
    """The whole GPU path, backward included: the backward kernels' launch
    replaced by the jnp backward (refusing vmap as jax-triton does)."""
    from gdn_jax import chunk_bwd

    monkeypatch.setattr(chunk_bwd, "chunk_bwd_triton", unbatchable(bwd_launch))
    chunk_bwd._triton_op.cache_clear()
    yield
    chunk_bwd._triton_op.cache_clear()
