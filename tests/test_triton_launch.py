"""The jax-triton launch's glue, without a GPU: which launches
:func:`gdn_jax.triton_launch.fwd_intra_triton` makes, with ``launch``
replaced by a recorder (the kernels themselves run in the interpreter tests
and on the GPU)."""
import jax
import jax.numpy as jnp
import pytest

from gdn_jax import triton_launch


@pytest.fixture
def launches(monkeypatch):
    """``[(kernel name, k-like operand shape, grid)]`` of every launch, in order."""
    calls = []

    def record(name, kernel, operands, *, out, grid, **kwargs):
        calls.append((name, operands[0].shape, grid))
        return jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype), out)

    monkeypatch.setattr(triton_launch, "launch", record)
    monkeypatch.setattr(triton_launch, "dot_precision", lambda: "tf32")
    monkeypatch.setattr(triton_launch, "triton_version", lambda: (3, 8))  # the seed's glue too
    monkeypatch.setenv("GDN_JAX_AUTOTUNE", "1")
    return calls


def abstract(B, T, Hg=2, H=4, K=64, V=32, N=None):
    k = jax.ShapeDtypeStruct((B, T, Hg, K), jnp.bfloat16)
    v = jax.ShapeDtypeStruct((B, T, H, V), jnp.bfloat16)
    g = beta = jax.ShapeDtypeStruct((B, T, H), jnp.float32)
    work = {} if N is None else dict(
        cu_seqlens=jax.ShapeDtypeStruct((N + 1,), jnp.int32),
        chunk_indices=jax.ShapeDtypeStruct((T // 64 + N, 2), jnp.int32))
    return (k, v, g, beta), work


@pytest.mark.parametrize("path,kernels", [("triton", ["fused"]), ("split", ["A", "recompute_w_u"]),
                                          ("seed", ["kkt_solve", "recompute_w_u"])])
@pytest.mark.parametrize("B,T,N,timed_rows", [
    (2, 2**19 + 37, None, (1, triton_launch.TIMING_ROWS)),  # fixed length: fewer rows and one batch row
    (1, 2**20, 3, (1, triton_launch.TIMING_ROWS)),  # packed: segments spread over fewer rows
    (64, 1024, None, (32, 1024)),  # many short rows: fewer batch rows
])
def test_long_launch_chooses_configs_on_fewer_rows(launches, path, kernels, B, T, N, timed_rows):
    args, work = abstract(B, T, N=N)
    jax.eval_shape(lambda *a: triton_launch.fwd_intra_triton(*a, path=path, **work), *args)
    names = [name for name, _, _ in launches]
    assert names == kernels + kernels  # first on fewer rows (configs chosen there), then the real launch
    fewer, real = launches[:len(kernels)], launches[len(kernels):]
    assert all(shape[:2] == timed_rows for _, shape, _ in fewer)
    assert all(shape[:2] == (B, T) for _, shape, _ in real)


def test_launch_of_headline_rows_or_fewer_times_itself(launches):
    args, _ = abstract(8, 4096)
    jax.eval_shape(lambda *a: triton_launch.fwd_intra_triton(*a, path="split"), *args)
    assert [(name, shape[:2]) for name, shape, _ in launches] == [("A", (8, 4096)), ("recompute_w_u", (8, 4096))]


def test_fixed_configs_time_nothing(launches, monkeypatch):
    monkeypatch.setenv("GDN_JAX_AUTOTUNE", "0")
    args, _ = abstract(2, 2**19 + 37)
    jax.eval_shape(lambda *a: triton_launch.fwd_intra_triton(*a, path="triton"), *args)
    assert [name for name, _, _ in launches] == ["fused"]


def test_grid_past_cuda_limit_raises_before_any_timing(launches):
    args, _ = abstract(70000, 1, H=1, K=32, V=32)  # 70000 batch rows > 65535 on the grid's second dim
    with pytest.raises(ValueError, match="70000 programs along batch rows B"):
        jax.eval_shape(lambda *a: triton_launch.fwd_intra_triton(*a, path="split"), *args)
    assert launches == []


@pytest.mark.parametrize("version,runs", [((3, 6), True), ((3, 8), True), ((3, 9), False), ((4, 0), False)])
def test_seed_on_a_triton_without_block_pointers_is_a_clear_error(launches, monkeypatch, version, runs):
    """impl="seed" on triton >= 3.9 (no tl.make_block_ptr, which the seed's
    kernel keeps): RuntimeError from both launchers, naming the triton it
    needs, before any launch; the other paths launch as before."""
    monkeypatch.setattr(triton_launch, "triton_version", lambda: version)
    args, _ = abstract(2, 130)
    seed = lambda *a: triton_launch.fwd_intra_triton(*a, path="seed")  # noqa: E731
    if runs:
        assert triton_launch.seed_triton_missing() is None
        jax.eval_shape(seed, *args)
        assert [name for name, _, _ in launches] == ["kkt_solve", "recompute_w_u"]
        return
    needs = r"impl='seed' cannot run here: .*make_block_ptr.* needs triton >= 3\.6 and < 3\.9"
    with pytest.raises(RuntimeError, match="fwd_intra: " + needs):
        jax.eval_shape(seed, *args)
    assert launches == []
    for path in ("triton", "split"):
        jax.eval_shape(lambda *a: triton_launch.fwd_intra_triton(*a, path=path), *args)
    assert [name for name, _, _ in launches] == ["fused", "A", "recompute_w_u"]
    torch = pytest.importorskip("torch")
    from gdn_jax import torch_launch

    k, v, g, beta = (torch.zeros(a.shape, dtype=torch.float32) for a in args)
    with pytest.raises(RuntimeError, match="fwd_intra_torch: " + needs):
        torch_launch.fwd_intra_torch(k, v, g, beta, path="seed", autotune=False)


def test_auto_never_picks_the_seed(monkeypatch):
    from gdn_jax import backend

    monkeypatch.setattr(backend, "cuda_available", lambda: True)
    for programs in (1, 2048, 2049, 16384, 10**7):
        for gluon in (False, True):
            assert backend.resolve_impl("fwd_intra", "auto", programs=programs, gluon=gluon) != "seed"
