"""Program order for the tiled matrix kernels: which tile a program id computes.

Two remaps, both bijections on ``[0, n_programs)``:

- :func:`xcd_remap`: MI300X dispatches workgroup ``p`` to XCD ``p % NUM_XCDS``, and each XCD has its own
  L2. Consecutive logical ids (tiles that share a K/V head or an A row panel) would land on 8 different
  L2s; the remap hands XCD ``x`` the contiguous logical range ``[x * per_xcd, ...)`` instead. The
  identity when ``NUM_XCDS == 1`` (NVIDIA, single-XCD AMD parts, the interpreter).
- :func:`grouped_tile`: GEMM "grouped ordering": ``GROUP_M`` row panels are swept together down each
  column panel, so a wave of concurrent programs reads ``GROUP_M`` A panels and a few B panels instead of
  one A panel and every B panel, and the reused panels stay in L2.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def xcd_remap(pid, n_programs, NUM_XCDS: tl.constexpr):
    if NUM_XCDS == 1:
        return pid
    xcd = pid % NUM_XCDS
    local = pid // NUM_XCDS
    per_xcd = tl.cdiv(n_programs, NUM_XCDS)
    # When n_programs is not a multiple, the first `tall` XCDs receive per_xcd programs, the rest one fewer.
    tall = n_programs % NUM_XCDS
    tall = tl.where(tall == 0, NUM_XCDS, tall)
    return tl.where(xcd < tall, xcd * per_xcd + local, tall * per_xcd + (xcd - tall) * (per_xcd - 1) + local)


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program `pid` in grouped ordering."""
    programs_per_group = GROUP_M * num_pid_n
    group = pid // programs_per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    within = pid % programs_per_group
    return first_m + within % group_rows, within // group_rows
