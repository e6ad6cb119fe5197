"""Test-environment shim: lets jax-triton 0.4.x run on triton 3.6 (the GPU
machine's, pinned by its torch). Put this folder on PYTHONPATH there only
(``scripts/device_run.sh 04``); it is not part of the package.

- triton 3.7 added TMA_TF32 to triton.backends.nvidia.driver; jax-triton 0.4
  imports it with TMA_DTYPE_DEVICE_TO_HOST and, when the import fails,
  silently disables its NVIDIA backend.
- triton 3.7 added "is_im2col" to compiled kernels' TMA descriptor metadata,
  which jax-triton 0.4 requires (below).
"""
try:
    import triton.backends.nvidia.driver as _driver
except Exception:  # no triton or no NVIDIA backend: nothing to patch
    _driver = None

if _driver is not None:
    if not hasattr(_driver, "TMA_DTYPE_DEVICE_TO_HOST"):
        _driver.TMA_DTYPE_DEVICE_TO_HOST = {}
    if not hasattr(_driver, "TMA_TF32"):
        _driver.TMA_TF32 = 0

# triton 3.7 added "is_im2col" to the TMA descriptor metadata of compiled kernels;
# jax-triton 0.4 requires the key (CompilationResult checks it). Triton 3.6 kernels
# have no im2col descriptors: the key is added as False.
try:
    from triton.backends.nvidia.compiler import CUDABackend as _CUDABackend
except Exception:
    _CUDABackend = None


def _with_im2col_key(stage):
    def wrapped(*args, **kwargs):
        out = stage(*args, **kwargs)
        for metadata in (a for a in (*args, *kwargs.values()) if isinstance(a, dict)):
            for meta in metadata.get("tensordesc_meta") or ():
                meta.setdefault("is_im2col", False)
        return out
    return wrapped


if _CUDABackend is not None and not getattr(_CUDABackend, "_im2col_key", False):
    _CUDABackend.gluon_to_ttgir = _with_im2col_key(_CUDABackend.gluon_to_ttgir)
    _CUDABackend.make_ttgir = staticmethod(_with_im2col_key(_CUDABackend.make_ttgir))
    _CUDABackend._im2col_key = True
