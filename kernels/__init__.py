"""Triton sources of gdn-jax (installed as ``gdn_jax.kernels``).

Only ``triton`` is imported here: no torch, no jax. The JAX launch lives in
``gdn_jax/triton_launch.py``, the PyTorch launch of the same kernels (tests
under ``TRITON_INTERPRET=1``, benchmarks) in ``gdn_jax/torch_launch.py``.

- ``kkt_solve.chunk_gated_delta_rule_fwd_kkt_solve_kernel``: the seed's fused
  ``beta * K K^T`` + ``(I + L)^-1`` kernel, writes ``A``.
- ``recompute_w_u.recompute_w_u_fwd_kernel``: ``u = A (beta v)``,
  ``w = A (beta exp(g) k)`` per chunk and head.
- ``chunk_qk.gdn_chunk_qk_kernel``: the output's masked, gated ``q k^T`` per
  chunk and head, which the walk from ``A`` (``chunk_fwd.py``) reads.
"""
