"""Gated activations for the MLP (SwiGLU, GeGLU), forward and backward, elementwise over rows.

    a   = act(gate)                 act = silu (SwiGLU) or gelu, tanh or erf form (GeGLU); kernels/_math.py
    y   = round(a) * up             round() to the input dtype first: Hugging Face computes
                                    act_fn(gate_proj(x)) as a tensor of the model dtype, then multiplies by
                                    up_proj(x). Rounding once after the product instead (Liger before its
                                    PR #783) gives different bf16 outputs from the model being replaced.
Backward, recomputing the activation instead of saving it (saved: gate and up, the inputs):

    dup   = dy * round(a)           the derivative of the function computed above
    dgate = dy * up * act'(gate)    in fp32, rounded once (eager rounds dy * up to the model dtype first)

muP multipliers (SCALED, Falcon-H1's ``mlp_multipliers``): scalars m_g on the gate and m_o on the output,

    g'    = round(gate * m_g)       rounded as Hugging Face's ``gate_proj(x) * gate_multiplier`` is
    y     = round(a(g')) * up * m_o rounded once
    dup   = dy * m_o * round(a(g'))
    dgate = dy * m_o * up * act'(g') * m_g

Two scalar multiplies per element, no byte more (traffic: the *_mup rows move the plain rows' bytes); off
(SCALED False) the kernels compile to the code without them (inspect: the plain rows unchanged). On, at
llama3-8b_ffn bf16 (`wavefront inspect`, December 2026): NVIDIA within -8 to +6 registers of the plain kernel,
but SwiGLU's backward on sm_90 goes from 40 to 44 registers (occupancy 75% -> 62.5%) and its forward on sm_100
from 32 to 38 (100% -> 75%); on gfx1100 SwiGLU's forward goes from 27 to 90 VGPRs at unchanged occupancy and
its backward from 91 to 99 (100% -> 75%). The multipliers cost registers on some targets, never bytes. m_o here stands for a multiplier applied after the down projection (Falcon-H1's down_multiplier):
down(y) * m_o = down(y * m_o), rounded once inside this kernel instead of once more after the GEMM, and the
[tokens x hidden] pass that multiply costs in eager is gone.

Traffic per element, 16-bit: forward reads gate and up and writes y: 6 B for ~6 FLOP (silu; ~12 for
gelu); backward reads gate, up, dy and writes dgate, dup: 10 B. Memory bound everywhere (intensity ~1).

FP8 epilogue (QUANT_GROUP 128 or 32, kernels/_quantize_epilogue.py): the forward also writes y's FP8
quantization with 1 x 128 or 1 x 32 scales, +1 B per element and 4 B per group, in place of a quantize
kernel that reads y again (6 + 1 B per element instead of 6 + 2 + 1). A program owns one BLOCK_N-column
block of a row (BLOCK_N a power of two >= 128, or the whole row), so its blocks hold whole scale groups.
Rowwise scales would need the amax of rows wider than a block (the ffn widths are 3-7 blocks): a
cross-program reduction and a second pass over y, no cheaper than the separate quantize, so not fused.

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
from wavefront.kernels._quantize_epilogue import alloc_fp8_out, fp8_constexprs, fp8_row_ptrs, quantize_block
from wavefront.kernels._tables import FamilyTable, SingleStage
from wavefront.runtime import Arch


@dataclass(frozen=True)
class GluTable:
    # 16-byte vectors per thread: 2 keeps two independent 128-bit loads in flight per tensor.
    vecs_per_thread: int
    # Block size cap in elements. 4096 16-bit values = 8 KiB per tensor per program with 8 warps (NVIDIA)
    # or 4 waves (AMD wave64): the backward's 5 live fp32 tensors stay far below the register limit.
    max_block: int
    max_warps: int


GLU_TABLES: FamilyTable[GluTable] = FamilyTable(
    GluTable(vecs_per_thread=2, max_block=4096, max_warps=8),
    "one row on every family: 8 KiB per tensor per program leaves the backward's 5 live fp32 tensors far below "
    "the register limit on 32- and 64-lane targets alike (the fields' comments)",
)


@dataclass(frozen=True)
class GluConfig(SingleStage):
    BLOCK_N: int
    num_warps: int


def glu_config(n_cols: int, dtype: torch.dtype, arch: Arch) -> GluConfig:
    """Pure function of (row width, dtype, architecture): blocks of whole 16-byte vectors per thread."""
    if n_cols < 1:
        raise ValueError(f"n_cols must be >= 1, got {n_cols}")
    table = GLU_TABLES[arch.family]
    block = min(next_pow2(n_cols), table.max_block)
    return GluConfig(BLOCK_N=block, num_warps=warps_for(block, dtype, arch, vecs_per_lane=table.vecs_per_thread,
                                                        max_warps=table.max_warps))


def _scaled(gate_mult: float, out_mult: float) -> bool:
    return float(gate_mult) != 1.0 or float(out_mult) != 1.0


@triton.jit
def _glu_fwd_kernel(gate_ptr, up_ptr, y_ptr, q_ptr, q_scale_ptr, n_cols, stride_gate_row, stride_up_row,
                    stride_y_row, gate_mult, out_mult, ACT: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
                    QUANT_GROUP: tl.constexpr, FP8_MAX: tl.constexpr, Q_EPS: tl.constexpr, POW2: tl.constexpr,
                    SCALED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * BLOCK_N
    cols = start + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    OUT = y_ptr.dtype.element_ty
    g = tl.load(gate_ptr + row * stride_gate_row + cols, mask=mask, other=0.0).to(ACC)
    u = tl.load(up_ptr + row * stride_up_row + cols, mask=mask, other=0.0).to(ACC)
    if SCALED:
        g = (g * gate_mult).to(OUT).to(ACC)
        u = u * out_mult
    a = activation(g, ACT).to(OUT).to(ACC)
    tl.store(y_ptr + row * stride_y_row + cols, (a * u).to(OUT), mask=mask)
    if QUANT_GROUP is not None:
        # The rounded y, as stored (the same expression: one conversion after CSE).
        q_row, s_row = fp8_row_ptrs(q_ptr, q_scale_ptr, row, n_cols, QUANT_GROUP)
        quantize_block((a * u).to(OUT).to(tl.float32), start, cols, mask, q_row, s_row, n_cols, QUANT_GROUP, BLOCK_N, FP8_MAX,
                       Q_EPS, POW2)


@triton.jit
def _glu_bwd_kernel(dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n_cols, stride_dy_row, stride_gate_row,
                    stride_up_row, stride_dgate_row, stride_dup_row, gate_mult, out_mult,
                    ACT: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr, SCALED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    OUT = dgate_ptr.dtype.element_ty
    dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=mask, other=0.0).to(ACC)
    g = tl.load(gate_ptr + row * stride_gate_row + cols, mask=mask, other=0.0).to(ACC)
    u = tl.load(up_ptr + row * stride_up_row + cols, mask=mask, other=0.0).to(ACC)
    if SCALED:
        g = (g * gate_mult).to(OUT).to(ACC)
        dy = dy * out_mult
    a, da = activation_and_grad(g, ACT)
    if SCALED:
        da = da * gate_mult
    tl.store(dup_ptr + row * stride_dup_row + cols, (dy * a.to(OUT).to(ACC)).to(OUT), mask=mask)
    tl.store(dgate_ptr + row * stride_dgate_row + cols, (dy * u * da).to(OUT), mask=mask)


def glu_fwd(gate: torch.Tensor, up: torch.Tensor, act: int,
            quant: tuple[torch.dtype, str, bool] | None = None, gate_mult: float = 1.0,
            out_mult: float = 1.0) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """gate, up: [n_rows, n_cols] with unit column stride (any row strides). Returns y, or with quant = (fp8
    dtype, "block1x128" | "block1x32", pow2 scale) (y, q, q_scale) as kernels.quantize.quantize(y) returns them.
    gate_mult, out_mult: the muP multipliers (the header); both 1.0 launch the kernel without them."""
    n_rows, n_cols = gate.shape
    y = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=gate.device)
    if quant is not None and quant[1] not in ("block1x128", "block1x32"):
        raise ValueError(f"glu_fwd: the FP8 epilogue takes 1 x G blocks, got scaling {quant[1]!r}")
    q, q_scale = alloc_fp8_out(quant, n_rows, n_cols, gate.device)
    if y.numel() == 0:
        return y if quant is None else (y, q, q_scale)
    cfg = glu_config(n_cols, gate.dtype, runtime.arch(gate.device))
    launch(_glu_fwd_kernel, (n_rows, triton.cdiv(n_cols, cfg.BLOCK_N)),
           gate_ptr=gate, up_ptr=up, y_ptr=y, q_ptr=q, q_scale_ptr=q_scale, n_cols=n_cols,
           stride_gate_row=gate.stride(0), stride_up_row=up.stride(0), stride_y_row=y.stride(0),
           gate_mult=float(gate_mult), out_mult=float(out_mult),
           constexprs=dict(ACT=act, BLOCK_N=cfg.BLOCK_N, ACC=acc_dtype(gate.dtype), **fp8_constexprs(quant),
                           SCALED=_scaled(gate_mult, out_mult)),
           options=cfg.options())
    return y if quant is None else (y, q, q_scale)


def glu_bwd(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int, gate_mult: float = 1.0,
            out_mult: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
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
           gate_mult=float(gate_mult), out_mult=float(out_mult),
           constexprs=dict(ACT=act, BLOCK_N=cfg.BLOCK_N, ACC=acc_dtype(gate.dtype), SCALED=_scaled(gate_mult, out_mult)),
           options=cfg.options())
    return dgate, dup
