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

Launch: per dtype group, a small device table with one row per tensor: six int64 addresses (param, grad,
exp_avg, exp_avg_sq, max_exp_avg_sq, master), the numel, and the tensor's first block in the launch
(``block_offsets``, a prefix sum of the tensors' block counts, n_tensors + 1 entries). Program i finds its
tensor by binary search over block_offsets (log2(n_tensors) loads from L1/L2; 9 for Llama-3-8B's 291
tensors), so no per-block table exists: the host work per step is independent of the parameter count in
elements. The table is built once per parameter set (:class:`AdamWTables`, cached by the tensors'
addresses) and reused while the addresses stay the same; the per-tensor scalars travel in a [n_tensors,
7] device tensor that the caller computes (row stride 0 when every tensor shares one row). Addresses read from memory carry no alignment facts, so when
every tensor is 16-byte aligned (as the allocator returns them) the host says so (ALIGNED:
``tl.multiple_of``), and whole blocks run without a mask: together that makes the loads and stores
128-bit. A tensor's tail block runs masked.

fp64 parameters accumulate in fp64 with IEEE sqrt and divide; complex parameters are the caller's to pass
as their real views (torch.optim.AdamW updates a complex tensor as its real view).

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
from wavefront.kernels import _memcheck
from wavefront.kernels._heuristics import acc_dtype, tl_dtype, warps_for
from wavefront.kernels._launch import launch, register_cache
from wavefront.kernels._tables import FamilyTable, SingleStage
from wavefront.runtime import Arch

N_PTRS = 6  # param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master
N_SCALARS = 7  # decay, 1 - b1, b2, 1 - b2, eps, -step_size, sqrt(bias_correction2)


@dataclass(frozen=True)
class AdamWConfig(SingleStage):
    BLOCK: int
    num_warps: int


# Elements per program: 2048 gives each NVIDIA thread one 16-byte vector of a bf16 parameter and two of
# each fp32 moment at 8 warps; AMD wave64 holds the same bytes per lane at 4 waves. Fewer, larger
# blocks cut table reads; larger ones leave small tensors' programs mostly masked.
ADAMW_BLOCK: FamilyTable[int] = FamilyTable(2048, "one block on every family: the same bytes per lane on 32- and "
                                                  "64-lane targets (above)")


def adamw_config(param_dtype: torch.dtype, arch: Arch) -> AdamWConfig:
    """Pure function of the parameter dtype and architecture."""
    block = ADAMW_BLOCK[arch.family]
    return AdamWConfig(BLOCK=block, num_warps=warps_for(block, param_dtype, arch, max_warps=8))


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
    if ACC == tl.float64:  # noqa: SIM300 (constexpr dtype, not a Yoda condition)
        # fp64 sqrt and divide are IEEE-rounded by default (and div_rn/sqrt_rn are fp32-only).
        denom = tl.sqrt(vd) / bc2_sqrt + eps
        p = p + (neg_step * m) / denom
    else:
        denom = tl.math.div_rn(tl.math.sqrt_rn(vd), bc2_sqrt) + eps
        p = p + tl.math.div_rn(neg_step * m, denom)
    _store(m_ptr, offs, n, m.to(S_DTYPE), MASKED)
    _store(v_ptr, offs, n, v.to(S_DTYPE), MASKED)
    if HAS_MASTER:
        _store(master_ptr, offs, n, p, MASKED)
    _store(p_ptr, offs, n, p.to(P_DTYPE), MASKED)


@triton.jit
def _adamw_kernel(ptrs_ptr, numels_ptr, block_offsets_ptr, scalars_ptr, stride_scalars_row, n_tensors, search_steps,
                  P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, HAS_MASTER: tl.constexpr,
                  AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK: tl.constexpr,
                  ACC: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    # The tensor of this block: the last ti with block_offsets[ti] <= pid. Invariant: offsets[lo] <= pid <
    # offsets[hi]; empty tensors (equal offsets) can never be lo. search_steps = ceil(log2(n_tensors)).
    lo = tl.zeros((), tl.int64)
    hi = tl.zeros((), tl.int64) + n_tensors
    for _ in range(search_steps):
        mid = (lo + hi) // 2
        below = tl.load(block_offsets_ptr + mid) <= pid
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    ti = lo
    start = tl.multiple_of((pid - tl.load(block_offsets_ptr + ti)) * BLOCK, BLOCK)
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    n = tl.load(numels_ptr + ti)
    row = ptrs_ptr + ti * 6
    sc = scalars_ptr + ti * stride_scalars_row
    # Whole blocks run unmasked (a mask built from a loaded numel defeats vectorization); the tail block of
    # each tensor runs masked.
    if start + BLOCK <= n:
        _adamw_block(row, sc, offs, n, False, P_DTYPE, G_DTYPE, S_DTYPE, HAS_MASTER, AMSGRAD, MAXIMIZE, ALIGNED, ACC)
    else:
        _adamw_block(row, sc, offs, n, True, P_DTYPE, G_DTYPE, S_DTYPE, HAS_MASTER, AMSGRAD, MAXIMIZE, ALIGNED, ACC)


Column = Sequence[torch.Tensor] | None


@dataclass(frozen=True)
class AdamWTables:
    """One dtype group's device tables: everything about the tensors that stays fixed while their
    addresses do (the per-step scalars travel separately)."""

    key: tuple  # (addresses, numels) the tables were built from
    ptrs: torch.Tensor  # [n_tensors, 6] int64 addresses
    numels: torch.Tensor  # [n_tensors] int64
    block_offsets: torch.Tensor  # [n_tensors + 1] int64: first block of each tensor; the last is the total
    n_blocks: int
    search_steps: int
    aligned: bool


def table_key(columns: Sequence[Column], numels: Sequence[int]) -> tuple:
    """What the tables depend on: every tensor's address in each column (0 for an absent column) and numels."""
    return (tuple(tuple(t.data_ptr() for t in col) if col is not None else None for col in columns), tuple(numels))


def build_tables(key: tuple, block: int, device) -> AdamWTables:
    """The device tables for a `table_key` (one host-to-device copy of ~(8 n_tensors) int64)."""
    addresses, numels = key
    n = len(numels)
    ptr_rows = [[col[i] if col is not None else 0 for col in addresses] for i in range(n)]
    offsets = [0]
    for numel in numels:
        offsets.append(offsets[-1] + -(-numel // block))
    aligned = all(a % 16 == 0 for col in addresses if col is not None for a in col)
    host = torch.tensor([v for r in ptr_rows for v in r] + list(numels) + offsets, dtype=torch.int64)
    dev = host.pin_memory().to(device, non_blocking=True) if torch.device(device).type == "cuda" else host.to(device)
    return AdamWTables(key=key, ptrs=dev[:6 * n].view(n, 6), numels=dev[6 * n:7 * n], block_offsets=dev[7 * n:],
                       n_blocks=offsets[-1], search_steps=max(0, (n - 1).bit_length()), aligned=aligned)


class TableCache:
    """The last few parameter sets' tables, by table_key: a training loop's step finds its tables here and
    copies nothing to the device until an address changes (new parameters, a reallocated gradient)."""

    def __init__(self, size: int = 8):
        self.size = size
        self._tables: dict[tuple, AdamWTables] = {}
        self.builds = 0

    def get(self, key: tuple, block: int, device) -> AdamWTables:
        full = (key, block, str(device))
        tables = self._tables.get(full)
        if tables is None:
            tables = build_tables(key, block, device)
            self.builds += 1
            if len(self._tables) >= self.size:
                self._tables.pop(next(iter(self._tables)))
            self._tables[full] = tables
        return tables


    def clear(self) -> None:
        self._tables.clear()


TABLES = TableCache()
register_cache(TABLES.clear)  # traffic measures each case from a cold table


def adamw_multi_tensor(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                       exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor],
                       max_exp_avg_sqs: Column, masters: Column, scalars: torch.Tensor, *, maximize: bool,
                       cache: TableCache = TABLES, key: tuple | None = None) -> None:
    """Update every tensor in place with one launch. All tensors are contiguous, real and on one device;
    within each list all dtypes are equal (params and grads may differ, as may the moments). ``scalars`` is
    a [n_tensors, 7] fp64 tensor on the device with a unit column stride (row stride 0 when all tensors
    share one row), see wavefront.ops.adamw.step_scalars.

    ``key``: the tensors' :func:`table_key`, when the caller already holds it (the optimizer keeps the
    addresses of the tensors it owns across steps); the tensors are then all non-empty, which the caller
    guarantees, and none of them is read on the host here."""
    if key is None:
        nonempty = [i for i, p in enumerate(params) if p.numel()]
        if not nonempty:
            return
        if len(nonempty) != len(params):
            def pick(col):
                return None if col is None else [col[i] for i in nonempty]
            params, grads, exp_avgs, exp_avg_sqs = (pick(c) for c in (params, grads, exp_avgs, exp_avg_sqs))
            max_exp_avg_sqs, masters = pick(max_exp_avg_sqs), pick(masters)
            scalars = scalars[torch.tensor(nonempty, device=scalars.device)]
        key = table_key((params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters), [p.numel() for p in params])
    device = params[0].device
    p_dtype, g_dtype, s_dtype = params[0].dtype, grads[0].dtype, exp_avgs[0].dtype
    cfg = adamw_config(p_dtype, runtime.arch(device))
    tables = cache.get(key, cfg.BLOCK, device)
    # the kernel reaches the tensors through the address table, not through arguments: tell memcheck
    with _memcheck.indirect(dict(params=params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs,
                                 max_exp_avg_sqs=max_exp_avg_sqs, masters=masters)):
        launch(
            _adamw_kernel, (tables.n_blocks,),
            ptrs_ptr=tables.ptrs, numels_ptr=tables.numels, block_offsets_ptr=tables.block_offsets,
            scalars_ptr=scalars, stride_scalars_row=scalars.stride(0), n_tensors=len(params),
            search_steps=tables.search_steps,
            constexprs=dict(P_DTYPE=tl_dtype(p_dtype), G_DTYPE=tl_dtype(g_dtype), S_DTYPE=tl_dtype(s_dtype),
                            HAS_MASTER=masters is not None, AMSGRAD=max_exp_avg_sqs is not None, MAXIMIZE=maximize,
                            ALIGNED=tables.aligned, BLOCK=cfg.BLOCK, ACC=acc_dtype(p_dtype)),
            options=cfg.options(),
        )
