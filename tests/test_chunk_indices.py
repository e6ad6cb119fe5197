"""Chunk indices: the host version against a plain loop, the in-graph version
against the host version plus padding rows."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_jax import prepare_chunk_indices
from gdn_jax.chunk_indices import chunk_indices_in_graph, padding_row


def loop_indices(cu, bt):
    return [(n, c) for n in range(len(cu) - 1) for c in range(-(-(cu[n + 1] - cu[n]) // bt))]


CASES = [[0, 1], [0, 64], [0, 65], [0, 0, 1, 1, 130, 130], [0, 63, 127, 192, 1000], [0, 0, 0]]


@pytest.mark.parametrize("cu", CASES)
def test_prepare_matches_loop(cu):
    ci = prepare_chunk_indices(np.array(cu), 64)
    assert ci.dtype == jnp.int32 and ci.shape == (len(loop_indices(cu, 64)), 2)
    assert [tuple(r) for r in np.asarray(ci)] == loop_indices(cu, 64)


@pytest.mark.parametrize("cu", CASES)
def test_in_graph_is_prepare_plus_padding(cu):
    T = cu[-1]
    ci = jax.jit(chunk_indices_in_graph, static_argnums=(1, 2))(jnp.asarray(cu, jnp.int32), T, 64)
    real = loop_indices(cu, 64)
    assert ci.shape == (-(-T // 64) + len(cu) - 1, 2)
    rows = [tuple(r) for r in np.asarray(ci)]
    assert rows[: len(real)] == real
    assert rows[len(real):] == [padding_row(T, 64)] * (len(rows) - len(real))
    for n, c in rows[len(real):]:  # every padding row covers no token
        assert c * 64 >= cu[n + 1] - cu[n]


def test_random_many_sequences():
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 200, size=1000)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    host = np.asarray(prepare_chunk_indices(cu, 64))
    graph = np.asarray(chunk_indices_in_graph(jnp.asarray(cu), int(cu[-1]), 64))
    np.testing.assert_array_equal(graph[: len(host)], host)
    assert [tuple(r) for r in host] == loop_indices(list(cu), 64)


def test_prepare_rejects_bad_input():
    with pytest.raises(ValueError, match="cu_seqlens"):
        prepare_chunk_indices(np.array([0.0, 3.0]), 64)
