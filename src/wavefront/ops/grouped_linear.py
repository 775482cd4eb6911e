"""Grouped linear over expert-contiguous rows: a plain-PyTorch stand-in with the kernel op's signature.

    y[rows of expert e] = x[rows of expert e] @ weight[e].T        rows of e: offsets[e-1] .. offsets[e]

offsets are cumulative END offsets (as ``torch._grouped_mm`` takes them); rows past ``offsets[-1]`` give
zeros. activation="swiglu": ``silu(gate) * up`` with ``gate, up = y.chunk(2, -1)`` -> (T, N/2).
Autograd is PyTorch's. The row bounds are read on the host (one sync per call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def grouped_linear(x: Tensor, weight: Tensor, offsets: Tensor, *, activation: str | None = None) -> Tensor:
    if activation not in (None, "swiglu"):
        raise ValueError(f"grouped_linear: argument 'activation' must be None or 'swiglu', got {activation!r}")
    if x.dim() != 2 or weight.dim() != 3 or x.shape[1] != weight.shape[2]:
        raise ValueError(f"grouped_linear: expected x (T, K) and weight (E, N, K), got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if offsets.shape != (weight.shape[0],):
        raise ValueError(f"grouped_linear: argument 'offsets' must have shape ({weight.shape[0]},), got "
                         f"{tuple(offsets.shape)}")
    ends = offsets.tolist()
    pieces, start = [], 0
    for e, end in enumerate(ends):
        pieces.append(F.linear(x[start:end], weight[e]))
        start = end
    pieces.append(x.new_zeros(x.shape[0] - start, weight.shape[1]))
    y = torch.cat(pieces)
    if activation == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y
