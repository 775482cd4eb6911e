"""Attention backward dK/dV for sm_100 (Blackwell) written in Gluon: the TMA ring, the tcgen05 products and
their completion are synchronized by mbarriers spelled out in the source, so the main loop keeps only the
block-wide barriers the data flow needs (Triton's dK/dV loop has 8 on sm_100, docs/kernels-attention-gemm.md).

Same math and contract as ``kernels/attention_bwd.py``'s dK/dV pass, with c = scale * log2(e):

    S^T_j  = K Q_j^T                                  [BLOCK_N keys, BLOCK_M queries], fp32 in tensor memory
    P^T_j  = exp2(c S^T_j - lse2_j)                   masked to 0 above the causal diagonal
    dP^T_j = V dO_j^T
    dS^T_j = P^T_j (dP^T_j - delta_j)
    dV    += P^T_j dO_j,   dK += dS^T_j Q_j           (fp32 accumulators in tensor memory; dK * scale at the end)

One program owns BLOCK_N = 128 keys of one K/V head and streams the (query head of the GQA group, query
tile) pairs j from the causal diagonal on. Two partitions (``gl.warp_specialize``):

- the **loader** warp: K and V by TMA once (one mbarrier), then Q_j and dO_j by TMA into a ring of
  NUM_STAGES stages; each stage has a *ready* mbarrier (expect-tx of both tiles) and an *empty* one, which the
  loader waits before refilling the stage;
- the **compute** partition (4 warps, one tensor-memory lane = one key row per thread): lse2_j and delta_j
  (BLOCK_M fp32 each) by plain loads, the elementwise work, and the tcgen05 issues. Iteration j, entering with
  S^T_j and dP^T_j issued (and dV/dK of j-1 before them):

    1. wait the MMA barrier (phase j): S^T_j, dP^T_j and every earlier product are done (tcgen05 products
       of one thread run in issue order, and a commit tracks all of them)
    2. S^T_j, dP^T_j from tensor memory to registers; P^T_j, dS^T_j in 16 bits into shared memory; fence;
       one barrier of the partition (every thread's tensor-memory reads and shared-memory writes are done
       before one thread issues products that read and overwrite them)
    3. issue dV += P^T_j dO_j and dK += dS^T_j Q_j; dK's completion arrives on the stage's *empty* barrier
       (the four products that read the stage are done: the loader may refill it)
    4. wait tile j+1's *ready* barrier, issue S^T_{j+1} and dP^T_{j+1}; dP^T's completion arrives on the
       MMA barrier (the last tile's dK arrives there instead: the epilogue's wait)

Block-wide barriers per iteration (the SASS of the main loop, ``wavefront inspect``: loop_barriers): 4, all
``BAR.SYNC 0x0, 0x80``, barrier 0 over the compute partition's 128 threads (the loader warp never waits on
them): step 2's, and three that Triton's barrier passes place (after the dV issue, after the S^T issue, and
before the MMA barrier's wait). Triton's dK/dV loop has 8 on sm_100.
Placing every product's completion on an mbarrier (dV and S^T included, with a false predicate) made it 6;
a single partition with the copies issued by the compute warps, 6 to 7 (the barrier pass orders every
mbarrier expect and copy after the waits on the same allocation).

The ring protocol (every wait satisfied by exactly one copy of the right phase, no stage refilled while a
product may read it, every copy consumed) is checked on an executable model built from this file's schedule
helpers (the ``_bwd_*`` integer functions below) by workbench/static/pipeline_models.py, over sequence lengths
around tile multiples, causal and not, GQA groups, head dims and ring depths, under several timings.

Rows past the sequence: TMA zero-fills Q and dO there and lse2/delta load as 0, so P^T = 1, dP^T = 0 and
dS^T = 0 on those columns and the products add exact zeros (the Triton path's argument); key rows past the
sequence are masked at the store.

Tiles and memory (d128, NUM_STAGES 2): shared K 32 + V 32 + ring 2 x (Q 16 + dO 16) + P^T 16 + dS^T 16 KiB
= 160 KiB; tensor memory S^T 64 + dP^T 64 + dV 128 + dK 128 = 384 of 512 columns. 4 compute warps and the
loader warp (the compiled block has 8 warps, 256 threads: whole warpgroups for setmaxnreg). Traffic is
the Triton TMA path's (each Q/dO tile read once per key tile).

Status: compiled ahead of time for sm_100 and read (``wavefront inspect``; tests/kernels/
test_attention_bwd_gluon.py). Gluon has no interpreter, so its numerics are unchecked until a GPU runs it;
nothing dispatches to it by default. ``WAVEFRONT_ATTENTION_BWD_GLUON=1`` asks for it in ``attention_bwd``
(deterministic backward only: dK/dV here, dQ by the Triton kernel); :func:`check_target` refuses every
target but sm_100. Dense inputs (no cu_seqlens), head_dim 64 or 128, bf16/fp16, GQA/MQA.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# Through the module, not `from ... import name`: with the names bound as module globals, defining a Gluon
# kernel under TRITON_INTERPRET=1 on a cold Triton cache leaves builder objects alive in Triton's extension,
# and every process that imports this module then ends with ~24 lines of "nanobind: leaked ..."
# (tests/workbench/static/test_worker_exit.py). The compiled code is the same either way.
from triton.experimental.gluon.language.nvidia import blackwell as bw

from wavefront import runtime
from wavefront.kernels import attention_gluon
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels.attention_gluon import DTYPES, HEAD_DIMS, LOG2E, _tma_addressable, flag_set

#: The environment switch that routes attention_bwd's dK/dV pass here (sm_100 only; off by default).
ENV_FLAG = "WAVEFRONT_ATTENTION_BWD_GLUON"
TARGET = "sm_100"
WHAT = "the Gluon sm_100 dK/dV backward"
BLOCK_M = 64  # query rows per tile: the N of S^T / dP^T and the K of the dV / dK products
BLOCK_N = 128  # keys per program: tcgen05's M of 128, one tensor-memory lane per thread of 4 warps
NUM_WARPS = 4
#: Q/dO ring depth per head dim (shared memory: 160 KiB at d128 with 2; 3 would be 192 KiB, 2 keeps room).
NUM_STAGES = {64: 3, 128: 2}
LOADER_REGS = gl.constexpr(24)  # the loader warp only issues copies: its registers go to the default partition


# The schedule. Every decision of the ring (how many tiles, which query head and rows a tile is, which stage
# it lands in, which mbarrier phase a wait is for, which tile refills a freed stage) is one of these integer
# functions; the kernel calls them and the pipeline model runs their Python bodies (`.fn`) on ints.


@gluon.jit
def _bwd_first_row(start_n, IS_CAUSAL: gl.constexpr):
    """The first query row a key tile meets: its own first row when causal (BLOCK_N is a multiple of
    BLOCK_M, so this is a tile boundary), else 0."""
    lo = 0
    if IS_CAUSAL:
        lo = start_n
    return lo


@gluon.jit
def _bwd_n_tiles(seqlen, lo, BLOCK_M: gl.constexpr):
    """Query tiles per query head from row lo to the end of the sequence."""
    return (seqlen - lo + BLOCK_M - 1) // BLOCK_M


@gluon.jit
def _bwd_tile_head(j, n_tiles):
    """The query head (within the group) of loop tile j: the loop runs head by head."""
    return j // n_tiles


@gluon.jit
def _bwd_tile_row(j, n_tiles, lo, BLOCK_M: gl.constexpr):
    """The first query row of loop tile j."""
    return lo + (j % n_tiles) * BLOCK_M


@gluon.jit
def _bwd_stage(j, NUM_STAGES: gl.constexpr):
    return j % NUM_STAGES


@gluon.jit
def _bwd_ready_phase(j, NUM_STAGES: gl.constexpr):
    """The parity of the ready barrier's phase that tile j's copy completes (its stage's (j // NUM_STAGES)-th)."""
    return (j // NUM_STAGES) & 1


@gluon.jit
def _bwd_empty_phase(j, NUM_STAGES: gl.constexpr):
    """The parity the loader waits for on the stage's empty barrier before copying tile j: the release of tile
    j - NUM_STAGES, the complement of the ready phase (a fresh barrier passes a wait for parity 1, so the
    ring's first pass does not wait)."""
    return ((j // NUM_STAGES) & 1) ^ 1


@gluon.jit
def _bwd_mma_phase(j):
    """The MMA barrier completes one phase per commit: the prologue's (S^T_0) is phase 0, iteration j's is
    phase j + 1; iteration j waits for phase j, the epilogue for phase n_iters."""
    return j & 1


@gluon.jit
def _loader(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, start_n,
            n_iters, n_tiles, lo, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The loader warp: K and V once, then every tile's Q and dO into its stage once the stage is empty."""
    bw.mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    bw.tma.async_load(k_desc, [start_n, 0], kv_bar, k_smem)
    bw.tma.async_load(v_desc, [start_n, 0], kv_bar, v_smem)
    for j in range(0, n_iters):
        stage = _bwd_stage(j, NUM_STAGES)
        g = _bwd_tile_head(j, n_tiles)
        row = _bwd_tile_row(j, n_tiles, lo, BLOCK_M)
        bw.mbarrier.wait(empty.index(stage), _bwd_empty_phase(j, NUM_STAGES))
        bar = ready.index(stage)
        bw.mbarrier.expect(bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        bw.tma.async_load(q_desc, [g, row, 0], bar, q_smem.index(stage))
        bw.tma.async_load(do_desc, [g, row, 0], bar, do_smem.index(stage))


@gluon.jit
def _issue_scores(k_smem, v_smem, q_smem, do_smem, ready, st_tmem, dpt_tmem, j, mma_bar, BLOCK_M: gl.constexpr,
                  HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Wait for tile j's stage, then S^T_j = K Q_j^T and dP^T_j = V dO_j^T (asynchronous); the MMA barrier
    completes a phase when they and every earlier product are done."""
    stage = _bwd_stage(j, NUM_STAGES)
    bw.mbarrier.wait(ready.index(stage), _bwd_ready_phase(j, NUM_STAGES))
    q = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
    do = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
    bw.tcgen05_mma(k_smem, q.permute((1, 0)), st_tmem, use_acc=False)
    bw.tcgen05_mma(v_smem, do.permute((1, 0)), dpt_tmem, use_acc=False, mbarriers=[mma_bar])


@gluon.jit
def _compute(q_smem, do_smem, k_smem, v_smem, pt_smem, dst_smem, kv_bar, ready, empty, mma_bar, st_tmem, dpt_tmem,
             dv_tmem, dk_tmem, lse_ptr, delta_ptr, dk_ptr, dv_ptr, b, kvh, h0, start_n, stride_lb, stride_lh,
             stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, seqlen, n_iters, n_tiles, lo,
             qk_scale, sm_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The default partition (4 warps, one key row per thread): the elementwise work and the tcgen05 issues."""
    dtype: gl.constexpr = q_smem.dtype
    s_reg: gl.constexpr = st_tmem.get_reg_layout()
    col_layout: gl.constexpr = gl.SliceLayout(0, s_reg)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_reg))
    offs_m0 = gl.arange(0, BLOCK_M, layout=col_layout)
    lse_base = lse_ptr + b * stride_lb + h0 * stride_lh
    delta_base = delta_ptr + b * stride_lb + h0 * stride_lh

    bw.mbarrier.wait(kv_bar, 0)
    _issue_scores(k_smem, v_smem, q_smem, do_smem, ready, st_tmem, dpt_tmem, 0, mma_bar, BLOCK_M, HEAD_DIM, NUM_STAGES)
    for j in range(0, n_iters):
        g = _bwd_tile_head(j, n_tiles)
        offs_m = _bwd_tile_row(j, n_tiles, lo, BLOCK_M) + offs_m0
        stat = g.to(gl.int64) * stride_lh + offs_m
        lse2 = gl.load(lse_base + stat, mask=offs_m < seqlen, other=0.0)
        delta = gl.load(delta_base + stat, mask=offs_m < seqlen, other=0.0)

        bw.mbarrier.wait(mma_bar, _bwd_mma_phase(j))  # S^T_j, dP^T_j and every earlier product are done
        s_t = st_tmem.load(s_reg)
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse2, 0))
        if IS_CAUSAL:
            p_t = gl.where(gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1), p_t, 0.0)
        dp_t = dpt_tmem.load(s_reg)
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        pt_smem.store(p_t.to(dtype))
        dst_smem.store(ds_t.to(dtype))
        bw.fence_async_shared()
        gl.barrier()  # every thread's tensor-memory reads and shared-memory writes are done

        stage = _bwd_stage(j, NUM_STAGES)
        bw.tcgen05_mma(pt_smem, do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM]), dv_tmem, use_acc=j > 0)
        # The stage is free once the four products reading it are done; the last tile's dK also completes
        # the MMA barrier's phase the epilogue waits for (no S^T / dP^T follow it).
        last = j + 1 == n_iters
        bw.tcgen05_mma(dst_smem, q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM]), dk_tmem, use_acc=j > 0,
                    mbarriers=[empty.index(stage), mma_bar], mbarrier_preds=[True, last])
        if not last:
            _issue_scores(k_smem, v_smem, q_smem, do_smem, ready, st_tmem, dpt_tmem, j + 1, mma_bar, BLOCK_M,
                          HEAD_DIM, NUM_STAGES)
    bw.mbarrier.wait(mma_bar, _bwd_mma_phase(n_iters))

    acc_reg: gl.constexpr = dv_tmem.get_reg_layout()
    rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_reg))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_reg))
    keep = gl.expand_dims(rows < seqlen, 1) & gl.expand_dims(cols < HEAD_DIM, 0)
    offs = gl.expand_dims(rows.to(gl.int64), 1)
    dv = dv_tmem.load(acc_reg)
    gl.store(dv_ptr + b * stride_dvb + kvh * stride_dvh + offs * stride_dvs + gl.expand_dims(cols, 0),
             dv.to(dv_ptr.dtype.element_ty), mask=keep)
    dk = dk_tmem.load(acc_reg) * sm_scale
    gl.store(dk_ptr + b * stride_dkb + kvh * stride_dkh + offs * stride_dks + gl.expand_dims(cols, 0),
             dk.to(dk_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def _attn_bwd_dkdv_sm100_gluon(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh,
    n_kv_heads, group_size, seqlen, n_n_blocks, qk_scale, sm_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
    NUM_STAGES: gl.constexpr,
):
    gl.static_assert(BLOCK_N % BLOCK_M == 0, "a causal key tile must start on a query tile boundary")
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_M, HEAD_DIM], dtype)
    pt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    s_tmem_layout: gl.constexpr = bw.TensorMemoryLayout(block=(BLOCK_N, BLOCK_M), col_stride=1)
    acc_tmem_layout: gl.constexpr = bw.TensorMemoryLayout(block=(BLOCK_N, HEAD_DIM), col_stride=1)

    pid = gl.program_id(0)
    bh = pid // n_n_blocks
    start_n = (pid % n_n_blocks) * BLOCK_N
    b = (bh // n_kv_heads).to(gl.int64)
    kvh = (bh % n_kv_heads).to(gl.int64)
    h0 = kvh * group_size  # the group's first query head

    k_desc = bw.tma.make_tensor_descriptor(k_ptr + b * stride_kb + kvh * stride_kh, [seqlen, HEAD_DIM], [stride_ks, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)
    v_desc = bw.tma.make_tensor_descriptor(v_ptr + b * stride_vb + kvh * stride_vh, [seqlen, HEAD_DIM], [stride_vs, 1],
                                        [BLOCK_N, HEAD_DIM], kv_layout)
    # Q and dO over the group's query heads, [group_size, seqlen, HEAD_DIM]: rows past the sequence are zeros.
    q_desc = bw.tma.make_tensor_descriptor(q_ptr + b * stride_qb + h0 * stride_qh, [group_size, seqlen, HEAD_DIM],
                                        [stride_qh, stride_qs, 1], [1, BLOCK_M, HEAD_DIM], tile_layout)
    do_desc = bw.tma.make_tensor_descriptor(do_ptr + b * stride_dob + h0 * stride_doh, [group_size, seqlen, HEAD_DIM],
                                         [stride_doh, stride_dos, 1], [1, BLOCK_M, HEAD_DIM], tile_layout)

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_M, HEAD_DIM], tile_layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_M, HEAD_DIM], tile_layout)
    pt_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], pt_layout)
    dst_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], pt_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], bw.mbarrier.MBarrierLayout())
    mma_bar = gl.allocate_shared_memory(gl.int64, [1], bw.mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bw.mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bw.mbarrier.MBarrierLayout())
    bw.mbarrier.init(kv_bar, count=1)
    bw.mbarrier.init(mma_bar, count=1)
    for s in gl.static_range(NUM_STAGES):
        bw.mbarrier.init(ready.index(s), count=1)
        bw.mbarrier.init(empty.index(s), count=1)
    bw.fence_async_shared()

    st_tmem = bw.allocate_tensor_memory(gl.float32, [BLOCK_N, BLOCK_M], s_tmem_layout)
    dpt_tmem = bw.allocate_tensor_memory(gl.float32, [BLOCK_N, BLOCK_M], s_tmem_layout)
    dv_tmem = bw.allocate_tensor_memory(gl.float32, [BLOCK_N, HEAD_DIM], acc_tmem_layout)
    dk_tmem = bw.allocate_tensor_memory(gl.float32, [BLOCK_N, HEAD_DIM], acc_tmem_layout)

    lo = _bwd_first_row(start_n, IS_CAUSAL)
    n_tiles = _bwd_n_tiles(seqlen, lo, BLOCK_M)
    n_iters = group_size * n_tiles
    gl.warp_specialize([
        (_compute, (q_smem, do_smem, k_smem, v_smem, pt_smem, dst_smem, kv_bar, ready, empty, mma_bar, st_tmem,
                    dpt_tmem, dv_tmem, dk_tmem, lse_ptr, delta_ptr, dk_ptr, dv_ptr, b, kvh, h0, start_n, stride_lb,
                    stride_lh, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, seqlen, n_iters,
                    n_tiles, lo, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N, IS_CAUSAL, NUM_STAGES)),
        (_loader, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, start_n,
                   n_iters, n_tiles, lo, BLOCK_M, NUM_STAGES)),
    ], [1], [LOADER_REGS])

    bw.mbarrier.invalidate(kv_bar)
    bw.mbarrier.invalidate(mma_bar)
    for s in gl.static_range(NUM_STAGES):
        bw.mbarrier.invalidate(ready.index(s))
        bw.mbarrier.invalidate(empty.index(s))


# ---------------------------------------------------------------------------------------------------
# Host side.


def requested() -> bool:
    """Whether the environment asks attention_bwd's dK/dV pass for this kernel (``WAVEFRONT_ATTENTION_BWD_GLUON=1``)."""
    return flag_set(ENV_FLAG)


def check_target(arch: runtime.Arch) -> None:
    """Refuse every target but sm_100, naming the flag (tcgen05 and tensor memory are Blackwell's)."""
    attention_gluon.check_target(arch, flag=ENV_FLAG, what=WHAT, target=TARGET)


def check_inputs(q, k, v, cu_seqlens, deterministic: bool) -> None:
    """What this kernel covers beyond ops.attention's own validation; anything else is a clear error (dO, which
    autograd hands over in whatever layout, is copied by :func:`attention_bwd_dkdv` where TMA cannot read it)."""
    if cu_seqlens is not None:
        raise ValueError(f"attention: {WHAT} takes dense inputs only; 'cu_seqlens' must be None")
    if not deterministic:
        raise ValueError(f"attention: {WHAT} is the deterministic backward's dK/dV pass; 'deterministic' must be "
                         "True (the atomic-dQ form is the Triton kernel's)")
    if q.dtype not in DTYPES:
        raise ValueError(f"attention: {WHAT} takes bfloat16 or float16, got {q.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"attention: {WHAT} takes head_dim 64 or 128, got {q.shape[-1]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not _tma_addressable(t):
            raise ValueError(f"attention: {WHAT} needs '{name}' addressable by TMA (16-byte aligned base and "
                             f"strides, unit head_dim stride), got strides {tuple(t.stride())}")


def attention_bwd_dkdv(do, q, k, v, lse2, delta, causal: bool, scale: float, dk, dv) -> None:
    """dK, dV into `dk`, `dv` (shaped like k, v) from the saved lse2 and delta = rowsum(dO * O), [B, H, S] fp32."""
    B, H, S, D = q.shape
    H_kv = k.shape[1]
    if not (_tma_addressable(do) and min(do.stride()) > 0):  # e.g. a broadcast gradient (stride 0)
        do = do.contiguous()
    n_n_blocks = triton.cdiv(S, BLOCK_N)
    ensure_descriptor_allocator(q.device)
    launch(
        _attn_bwd_dkdv_sm100_gluon, (n_n_blocks * B * H_kv,),
        q_ptr=q, k_ptr=k, v_ptr=v, do_ptr=do, lse_ptr=lse2, delta_ptr=delta, dk_ptr=dk, dv_ptr=dv,
        **{f"stride_{name}{dim}": t.stride(i) for name, t in (("q", q), ("k", k), ("v", v), ("do", do), ("dk", dk),
                                                                ("dv", dv)) for i, dim in enumerate("bhs")},
        stride_lb=lse2.stride(0), stride_lh=lse2.stride(1),
        n_kv_heads=H_kv, group_size=H // H_kv, seqlen=S, n_n_blocks=n_n_blocks, qk_scale=scale * LOG2E, sm_scale=scale,
        constexprs=dict(HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, IS_CAUSAL=causal, NUM_STAGES=NUM_STAGES[D]),
        options={"num_warps": NUM_WARPS, "num_stages": 1},
    )
