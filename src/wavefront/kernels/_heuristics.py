"""The launch arithmetic every launcher shares: 16-byte vectors, lanes, powers of two, accumulation dtypes.

One rule each, used by row_config.py, glu.py, rope.py, adamw.py, norm.py, softmax.py and cross_entropy.py:

- Loads and stores are widest at 16 bytes per lane (``ld.global.v4.b32`` on NVIDIA, ``global_load_dwordx4``
  on AMD), so a launcher sizes its block so that each lane moves whole 16-byte vectors:
  :func:`elems_per_vector` elements of the tensor's dtype per vector.
- :func:`warps_for` turns "elements per program" into warps (or wavefronts) of ``arch.warp_size`` lanes
  holding ``vecs_per_lane`` vectors each, rounded to a power of two and clamped to the architecture's limit.
- Accumulation is fp32, fp64 for fp64 inputs (:func:`acc_dtype` for kernels, :func:`stat_dtype` for the
  tensors the host allocates for per-row statistics and partials).
"""

from __future__ import annotations

import torch

from wavefront.runtime import Arch

# Importing this module does not import Triton (the op layer uses stat_dtype): tl is imported where used.

#: Widest global access per lane, bytes (128-bit vectors on every target).
VECTOR_BYTES = 16


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype`."""
    return dtype.itemsize


def elems_per_vector(dtype: torch.dtype) -> int:
    """Elements of `dtype` in one 16-byte vector (at least 1)."""
    return max(1, VECTOR_BYTES // itemsize(dtype))


def warps_for(elems: int, dtype: torch.dtype, arch: Arch, *, vecs_per_lane: int = 1,
              max_warps: int | None = None) -> int:
    """Warps (wavefronts) for a program over `elems` elements with `vecs_per_lane` 16-byte vectors per lane:
    a power of two, at least 1, at most `max_warps` and the architecture's block limit."""
    want = max(1, elems // (vecs_per_lane * elems_per_vector(dtype) * arch.warp_size))
    cap = arch.max_num_warps if max_warps is None else min(max_warps, arch.max_num_warps)
    return min(next_pow2(want), cap)


def acc_dtype(dtype: torch.dtype):
    """The kernels' accumulation dtype (a Triton type): fp64 for fp64 inputs, fp32 otherwise."""
    import triton.language as tl  # lazy: Triton-free import

    return tl.float64 if dtype == torch.float64 else tl.float32


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of per-row statistics and partial sums: fp64 for fp64 inputs, fp32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tl_dtype(dtype: torch.dtype):
    """The Triton element type of a floating torch dtype (pointer casts of table-driven kernels)."""
    import triton.language as tl  # lazy: Triton-free import

    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
            torch.float64: tl.float64}[dtype]
