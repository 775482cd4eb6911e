"""Small kernels with hand-computable machine code and traffic, for the inspect and traffic tests.

They live in their own module (not a test file) so the inspect compile workers can import them by name.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def read_twice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = x + x[reversed]: every element of x is read twice, y written once."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(x_ptr + offs, mask=mask, other=0.0)
    b = tl.load(x_ptr + (n - 1 - offs), mask=mask, other=0.0)
    tl.store(y_ptr + offs, a + b, mask=mask)


@triton.jit
def atomic_add_kernel(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_add(total_ptr + offs % 4, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=mask)


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)
