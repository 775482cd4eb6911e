"""Gated activations for the MLP (SwiGLU, GeGLU), forward and backward, elementwise over rows.

    a   = act(gate)                 act = silu (SwiGLU) or gelu, tanh or erf form (GeGLU); kernels/_math.py
    y   = round(a) * up             round() to the input dtype first: Hugging Face computes
                                    act_fn(gate_proj(x)) as a tensor of the model dtype, then multiplies by
                                    up_proj(x). Rounding once after the product instead (Liger before its
                                    PR #783) gives different bf16 outputs from the model being replaced.
Backward, recomputing the activation instead of saving it (saved: gate and up, the inputs):

    dup   = dy * round(a)           the derivative of the function computed above
    dgate = dy * up * act'(gate)    in fp32, rounded once (eager rounds dy * up to the model dtype first)

Traffic per element, 16-bit: forward reads gate and up and writes y: 6 B for ~6 FLOP (silu; ~12 for
gelu); backward reads gate, up, dy and writes dgate, dup: 10 B. Memory bound everywhere (intensity ~1).

Vector width: each thread owns ``VECS_PER_THREAD`` whole 16-byte vectors (8 bf16 / 4 fp32 values) of a
row, so loads and stores are 128-bit (``ld.global.v4`` on NVIDIA, ``global_load_dwordx4`` on AMD) when
the row stride is a multiple of 8 elements. Rows are addressed with an int64 row index times the row
stride, so gate/up may be column slices of one fused [rows, 2 x intermediate] projection (no copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype, next_pow2, warps_for
from wavefront.kernels._launch import launch
from wavefront.kernels._math import activation, activation_and_grad
from wavefront.runtime import Arch


@dataclass(frozen=True)
class GluTable:
    # 16-byte vectors per thread: 2 keeps two independent 128-bit loads in flight per tensor.
    vecs_per_thread: int
    # Block size cap in elements. 4096 16-bit values = 8 KiB per tensor per program with 8 warps (NVIDIA)
    # or 4 waves (AMD wave64): the backward's 5 live fp32 tensors stay far below the register limit.
    max_block: int
    max_warps: int


GLU_TABLES: dict[str, GluTable] = {
    "nvidia": GluTable(vecs_per_thread=2, max_block=4096, max_warps=8),
    "amd-cdna": GluTable(vecs_per_thread=2, max_block=4096, max_warps=8),
    "amd-rdna": GluTable(vecs_per_thread=2, max_block=4096, max_warps=8),
    "cpu": GluTable(vecs_per_thread=2, max_block=4096, max_warps=8),
}


@dataclass(frozen=True)
class GluConfig:
    BLOCK_N: int
    num_warps: int

    def options(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": 1}


def glu_config(n_cols: int, dtype: torch.dtype, arch: Arch) -> GluConfig:
    """Pure function of (row width, dtype, architecture): blocks of whole 16-byte vectors per thread."""
    if n_cols < 1:
        raise ValueError(f"n_cols must be >= 1, got {n_cols}")
    table = GLU_TABLES[arch.family]
    block = min(next_pow2(n_cols), table.max_block)
    return GluConfig(BLOCK_N=block, num_warps=warps_for(block, dtype, arch, vecs_per_lane=table.vecs_per_thread,
                                                        max_warps=table.max_warps))


@triton.jit
def _glu_fwd_kernel(gate_ptr, up_ptr, y_ptr, n_cols, stride_gate_row, stride_up_row, stride_y_row,
                    ACT: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    OUT = y_ptr.dtype.element_ty
    g = tl.load(gate_ptr + row * stride_gate_row + cols, mask=mask, other=0.0).to(ACC)
    u = tl.load(up_ptr + row * stride_up_row + cols, mask=mask, other=0.0).to(ACC)
    a = activation(g, ACT).to(OUT).to(ACC)
    tl.store(y_ptr + row * stride_y_row + cols, (a * u).to(OUT), mask=mask)


@triton.jit
def _glu_bwd_kernel(dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n_cols, stride_dy_row, stride_gate_row,
                    stride_up_row, stride_dgate_row, stride_dup_row,
                    ACT: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    OUT = dgate_ptr.dtype.element_ty
    dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=mask, other=0.0).to(ACC)
    g = tl.load(gate_ptr + row * stride_gate_row + cols, mask=mask, other=0.0).to(ACC)
    u = tl.load(up_ptr + row * stride_up_row + cols, mask=mask, other=0.0).to(ACC)
    a, da = activation_and_grad(g, ACT)
    tl.store(dup_ptr + row * stride_dup_row + cols, (dy * a.to(OUT).to(ACC)).to(OUT), mask=mask)
    tl.store(dgate_ptr + row * stride_dgate_row + cols, (dy * u * da).to(OUT), mask=mask)


def glu_fwd(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    """gate, up: [n_rows, n_cols] with unit column stride (any row strides)."""
    n_rows, n_cols = gate.shape
    y = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=gate.device)
    if y.numel() == 0:
        return y
    cfg = glu_config(n_cols, gate.dtype, runtime.arch(gate.device))
    launch(_glu_fwd_kernel, (n_rows, triton.cdiv(n_cols, cfg.BLOCK_N)),
           gate_ptr=gate, up_ptr=up, y_ptr=y, n_cols=n_cols, stride_gate_row=gate.stride(0),
           stride_up_row=up.stride(0), stride_y_row=y.stride(0),
           constexprs=dict(ACT=act, BLOCK_N=cfg.BLOCK_N, ACC=acc_dtype(gate.dtype)), options=cfg.options())
    return y


def glu_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = gate.shape
    dgate = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=gate.device)
    dup = torch.empty_like(dgate)
    if dgate.numel() == 0:
        return dgate, dup
    cfg = glu_config(n_cols, gate.dtype, runtime.arch(gate.device))
    launch(_glu_bwd_kernel, (n_rows, triton.cdiv(n_cols, cfg.BLOCK_N)),
           dy_ptr=dy, gate_ptr=gate, up_ptr=up, dgate_ptr=dgate, dup_ptr=dup, n_cols=n_cols,
           stride_dy_row=dy.stride(0), stride_gate_row=gate.stride(0), stride_up_row=up.stride(0),
           stride_dgate_row=dgate.stride(0), stride_dup_row=dup.stride(0),
           constexprs=dict(ACT=act, BLOCK_N=cfg.BLOCK_N, ACC=acc_dtype(gate.dtype)), options=cfg.options())
    return dgate, dup
