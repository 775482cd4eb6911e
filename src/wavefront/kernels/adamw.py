"""Fused multi-tensor AdamW: one launch updates every parameter of a dtype group, through pointer tables.

Per element, in torch.optim.AdamW's single-tensor order (``foreach=False``), with the per-tensor scalars
computed on the host in float64 exactly as torch computes them and rounded to the accumulation dtype:

    p = p * (1 - lr wd)                                  decoupled weight decay
    m = m + (1 - b1) (g - m)                             torch.lerp (weight < 0.5; the other form above)
    v = v b2;  v = v + ((1 - b2) g) g                    mul_ then addcmul_
    vmax = max(vmax, v)                                  amsgrad only; the denominator then uses vmax
    d = sqrt(v) / sqrt(1 - b2^t) + eps                   IEEE sqrt and divide (sqrt_rn, div_rn): torch's
    p = p + ((-lr / (1 - b1^t)) m) / d                   ops are correctly rounded, the GPU defaults not
    g = -g first when maximizing

Master weights: for 16-bit parameters the update runs on an fp32 copy (``p`` above) and the parameter
receives its rounding; moments are then fp32 too.

Launch: the host builds, per dtype group, a table of int64 addresses (param, grad, exp_avg, exp_avg_sq,
max_exp_avg_sq, master) per tensor, the tensors' numels and their scalars, and a block list (tensor
index, first element) covering every tensor in BLOCK-element pieces. Program i reads its block's row of
the tables and casts the addresses to typed pointers. All tensors are contiguous; offsets are int64.
Addresses read from memory carry no alignment facts, so when every tensor is 16-byte aligned (as the
allocator returns them) the host says so (ALIGNED: ``tl.multiple_of``), and whole blocks run without a
mask: together that makes the loads and stores 128-bit. A tensor's tail block runs masked.

Traffic per element: read p, g, m, v and write p, m, v (+ vmax read/write with amsgrad, + the master's
read/write): 7 accesses, 26 B for fp32 parameters and states; ~15 FLOP. Memory bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._launch import launch
from wavefront.runtime import Arch

N_PTRS = 6  # param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master
N_SCALARS = 7  # decay, 1 - b1, b2, 1 - b2, eps, -step_size, sqrt(bias_correction2)
_VECTOR_BYTES = 16


@dataclass(frozen=True)
class AdamWConfig:
    BLOCK: int
    num_warps: int

    def options(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": 1}


# Elements per program: 2048 gives each NVIDIA thread one 16-byte vector of a bf16 parameter and two of
# each fp32 moment at 8 warps; AMD wave64 holds the same bytes per lane at 4 waves. Fewer, larger
# blocks cut table reads; larger ones leave small tensors' programs mostly masked.
ADAMW_BLOCK = {"nvidia": 2048, "amd-cdna": 2048, "amd-rdna": 2048, "cpu": 2048}


def adamw_config(param_dtype: torch.dtype, arch: Arch) -> AdamWConfig:
    """Pure function of the parameter dtype and architecture."""
    block = ADAMW_BLOCK[arch.family]
    per_thread = _VECTOR_BYTES // torch.empty((), dtype=param_dtype).element_size()
    warps = max(1, block // (per_thread * arch.warp_size))
    return AdamWConfig(BLOCK=block, num_warps=min(warps, 8, arch.max_num_warps))


@triton.jit
def _load(ptr, offs, n, MASKED: tl.constexpr):
    if MASKED:
        x = tl.load(ptr + offs, mask=offs < n, other=0.0)
    else:
        x = tl.load(ptr + offs)
    return x


@triton.jit
def _store(ptr, offs, n, value, MASKED: tl.constexpr):
    if MASKED:
        tl.store(ptr + offs, value, mask=offs < n)
    else:
        tl.store(ptr + offs, value)


@triton.jit
def _adamw_block(row, sc, offs, n, MASKED: tl.constexpr, P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr,
                 HAS_MASTER: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, ALIGNED: tl.constexpr,
                 ACC: tl.constexpr):
    decay = tl.load(sc).to(ACC)
    w1 = tl.load(sc + 1).to(ACC)
    b2 = tl.load(sc + 2).to(ACC)
    w2 = tl.load(sc + 3).to(ACC)
    eps = tl.load(sc + 4).to(ACC)
    neg_step = tl.load(sc + 5).to(ACC)
    bc2_sqrt = tl.load(sc + 6).to(ACC)
    p_ptr = tl.load(row).to(tl.pointer_type(P_DTYPE))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(G_DTYPE))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(S_DTYPE))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(S_DTYPE))
    if ALIGNED:
        # Addresses read from a table carry no alignment facts; the host checked 16-byte alignment, so say
        # it: with it (and an unmasked block) loads and stores become 128-bit.
        p_ptr = tl.multiple_of(p_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        m_ptr = tl.multiple_of(m_ptr, 16)
        v_ptr = tl.multiple_of(v_ptr, 16)
    if HAS_MASTER:
        master_ptr = tl.load(row + 5).to(tl.pointer_type(tl.float32))
        if ALIGNED:
            master_ptr = tl.multiple_of(master_ptr, 16)
        p = _load(master_ptr, offs, n, MASKED).to(ACC)
    else:
        p = _load(p_ptr, offs, n, MASKED).to(ACC)
    g = _load(g_ptr, offs, n, MASKED).to(ACC)
    if MAXIMIZE:
        g = -g
    m = _load(m_ptr, offs, n, MASKED).to(ACC)
    v = _load(v_ptr, offs, n, MASKED).to(ACC)
    p = p * decay
    # torch.lerp's two forms, chosen by the weight, so both round the same way.
    m = tl.where(w1 < 0.5, m + w1 * (g - m), g - (g - m) * (1.0 - w1))
    v = v * b2
    v = v + w2 * g * g
    vd = v
    if AMSGRAD:
        vmax_ptr = tl.load(row + 4).to(tl.pointer_type(S_DTYPE))
        if ALIGNED:
            vmax_ptr = tl.multiple_of(vmax_ptr, 16)
        vd = tl.maximum(_load(vmax_ptr, offs, n, MASKED).to(ACC), v)
        _store(vmax_ptr, offs, n, vd.to(S_DTYPE), MASKED)
    denom = tl.math.div_rn(tl.math.sqrt_rn(vd), bc2_sqrt) + eps
    p = p + tl.math.div_rn(neg_step * m, denom)
    _store(m_ptr, offs, n, m.to(S_DTYPE), MASKED)
    _store(v_ptr, offs, n, v.to(S_DTYPE), MASKED)
    if HAS_MASTER:
        _store(master_ptr, offs, n, p, MASKED)
    _store(p_ptr, offs, n, p.to(P_DTYPE), MASKED)


@triton.jit
def _adamw_kernel(ptrs_ptr, numels_ptr, scalars_ptr, block_tensor_ptr, block_start_ptr,
                  P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, HAS_MASTER: tl.constexpr,
                  AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr,
                  ACC: tl.constexpr):
    pid = tl.program_id(0)
    ti = tl.load(block_tensor_ptr + pid).to(tl.int64)
    start = tl.multiple_of(tl.load(block_start_ptr + pid), BLOCK)
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    n = tl.load(numels_ptr + ti)
    row = ptrs_ptr + ti * 6
    sc = scalars_ptr + ti * 7
    # Whole blocks run unmasked (a mask built from a loaded numel defeats vectorization); the tail block of
    # each tensor runs masked.
    if start + BLOCK <= n:
        _adamw_block(row, sc, offs, n, False, P_DTYPE, G_DTYPE, S_DTYPE, HAS_MASTER, AMSGRAD, MAXIMIZE, ALIGNED, ACC)
    else:
        _adamw_block(row, sc, offs, n, True, P_DTYPE, G_DTYPE, S_DTYPE, HAS_MASTER, AMSGRAD, MAXIMIZE, ALIGNED, ACC)


_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float64: tl.float64}


def step_scalars(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: float) -> tuple:
    """The per-tensor scalars, computed in float64 as torch.optim.AdamW computes them."""
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    return (1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, eps, -(lr / bias_correction1),
            bias_correction2 ** 0.5)


def adamw_multi_tensor(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                       exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor],
                       max_exp_avg_sqs: Sequence[torch.Tensor] | None, masters: Sequence[torch.Tensor] | None,
                       scalars: Sequence[tuple], *, maximize: bool) -> None:
    """Update every tensor in place with one launch. All tensors are contiguous and on one device; within
    each list all dtypes are equal (params and grads may differ, as may the moments)."""
    if not params:
        return
    device = params[0].device
    p_dtype, g_dtype, s_dtype = params[0].dtype, grads[0].dtype, exp_avgs[0].dtype
    cfg = adamw_config(p_dtype, runtime.arch(device))
    ptr_rows, numels, block_tensor, block_start = [], [], [], []
    for i, p in enumerate(params):
        ptr_rows.append([p.data_ptr(), grads[i].data_ptr(), exp_avgs[i].data_ptr(), exp_avg_sqs[i].data_ptr(),
                         max_exp_avg_sqs[i].data_ptr() if max_exp_avg_sqs is not None else 0,
                         masters[i].data_ptr() if masters is not None else 0])
        numels.append(p.numel())
        starts = range(0, p.numel(), cfg.BLOCK)
        block_tensor.extend([i] * len(starts))
        block_start.extend(starts)
    if not block_tensor:
        return

    def table(values, dtype):
        t = torch.tensor(values, dtype=dtype)
        return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

    acc = tl.float64 if p_dtype == torch.float64 else tl.float32
    tensors = [*params, *grads, *exp_avgs, *exp_avg_sqs, *(max_exp_avg_sqs or ()), *(masters or ())]
    aligned = all(t.data_ptr() % 16 == 0 for t in tensors)
    launch(
        _adamw_kernel, (len(block_tensor),),
        table(ptr_rows, torch.int64), table(numels, torch.int64), table([list(s) for s in scalars], torch.float64),
        table(block_tensor, torch.int32), table(block_start, torch.int64),
        constexprs=dict(P_DTYPE=_TL[p_dtype], G_DTYPE=_TL[g_dtype], S_DTYPE=_TL[s_dtype],
                        HAS_MASTER=masters is not None, AMSGRAD=max_exp_avg_sqs is not None, MAXIMIZE=maximize,
                        ALIGNED=aligned, BLOCK=cfg.BLOCK, ACC=acc),
        options=cfg.options(),
    )
