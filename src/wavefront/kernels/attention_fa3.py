"""Attention forward for sm_90 at FlashAttention-3's design (Shah et al. 2024), written in Gluon: a warp-
specialized, ping-ponged, persistent kernel whose main loop carries no mask.

Same math and contract as ``kernels/attention_fwd.py``'s forward: per (batch, head), with c = scale * log2(e),

    S_j = Q K_j^T (fp32 in registers),  x = c S_j (masked to -inf past the sequence / after the query)
    m'  = max(m, rowmax x),  P_j = exp2(x - m'),  alpha = exp2(m - m')
    l   = alpha l + rowsum P_j,  O = alpha O + P_j V_j,  m = m'
    O   = O / l,  lse2 = m + log2 l        (lse2: [B, H, S] fp32, base 2, as ops.attention saves it)

Design (what each piece buys, and where it lives):

- **Warp specialization.** One program = three partitions (``gl.warp_specialize``): a producer warp that only
  issues TMA copies (Q once per tile, K and V blocks through a ring of NUM_STAGES stages) and gives its
  registers back (``setmaxnreg`` down to PRODUCER_REGS), and two consumer warpgroups (``setmaxnreg`` up to
  CONSUMER_REGS) that each own 64 of the tile's BLOCK_M = 128 query rows and run the wgmmas and the softmax.
  Every ring stage has a *ready* mbarrier (the producer's expect-tx; the copy completes it) and an *empty*
  mbarrier (count 2: each consumer arrives once its wgmma reading the stage has retired); the producer waits
  *empty* before refilling. The Q buffer has the same pair.
- **Softmax under the GEMMs (intra-warpgroup overlap).** Each consumer enters iteration j holding P_j; it
  issues S_{j+1} = Q K_{j+1}^T and O += P_j V_j back to back (async), waits with depth 1 (S_{j+1} done,
  P_j V_j still running), releases K_{j+1}'s stage, runs the softmax of S_{j+1} while P_j V_j runs, then
  waits depth 0, releases V_j's stage and rescales O. No wgmma group crosses the loop's back edge (ptxas
  serializes every wgmma of a kernel when one does: C7514, docs/kernels-attention-gemm.md). That is the PTX's
  order; ptxas (13.4) hoists the depth-0 wait above the exp2s, so in the SASS only the row max runs under
  P_j V_j and the rest of the softmax is hidden by the ping-pong alone.
- **Ping-pong between the consumers (named barriers).** Each consumer issues its two GEMMs of an iteration
  as one burst between ``bar.sync PINGPONG_BAR + c, 256`` (its turn) and ``bar.arrive PINGPONG_BAR + 1 - c,
  256`` (the other's turn), so the bursts alternate 0, 1, 0, 1, ...: one warpgroup's softmax runs under the
  other's GEMMs and the tensor cores never wait for an exp2. Consumer 1 arrives once at the start (consumer 0
  goes first) and consumer 0 syncs once at the end (consuming consumer 1's last arrive), so every named
  barrier completes as many times as it is used. Gluon has no named-barrier op; ``gl.inline_asm`` emits them
  (ids 14 and 15: Triton's warp specialization uses id 0 and low ids for partition-local barriers).
- **No mask in the main loop.** The key blocks of a query tile split into [0, n_unmasked), where every
  (row, key) pair is valid (key < seqlen, and key <= row when causal), and [n_unmasked, n_blocks), which
  straddle the causal diagonal or the sequence end. The main loop runs the softmax of the unmasked blocks
  without a compare or a select; a second loop (MASKED) covers every straddling block but the last one (more
  than one when BLOCK_N < BLOCK_M) and the prologue's block 0 is masked too, so every block that needs a mask
  gets it whatever the shapes (``_key_blocks``).
- **Persistent, causal-aware schedule.** grid = min(#SMs, tiles); program p takes tiles p, p + grid, ... in an
  order where the longest tiles come first (causal: every head's last query tile, then the one before, ...),
  so the short tiles fill the tail. The producer and both consumers walk the same tile sequence; the ring's
  stage and phase counters run on across tiles.

Ring, barrier and ping-pong protocol: executable model in workbench/static/pipeline_models.py
(``fa3_attention_fwd``), built from this file's schedule helpers (their Python bodies run on ints) and run
by the pipeline checker over sequence lengths (partial tiles, 1..many blocks), causal flags, ring depths,
block shapes, #programs vs tiles and several interleavings of the three partitions; it flags deadlocks,
stage overwrites, phase errors and broken ping-pong order.

Data movement: 4-D TMA descriptors over [B, H, S, D] (Q, O) and [B, H_kv, S, D] (K, V), made once per
program; the sequence bound is per (batch, head), so rows past S arrive as zeros and O's store is clipped.
Shared memory at d128, NUM_STAGES 2: Q 32 KiB + 2 x (K 32 + V 32) KiB + O 2 x 16 KiB = 192 KiB.
Registers per consumer thread at d128: S (64 fp32) + O (64) + P (32 as 16-bit pairs) + row state.

Traffic and FLOPs are the default kernel's (kernels/attention_fwd.py): compute bound at the bench shapes.

Status: compiled ahead of time for sm_90 and read (``wavefront inspect``); it has never run on a GPU, so
its numerics are unverified and nothing dispatches to it by default. ``WAVEFRONT_ATTENTION_FA3=1`` asks for
it (sm_90 only; :func:`check_target`). Dense inputs, head_dim 64 or 128, bf16/fp16, GQA/MQA.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from wavefront import runtime
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels.attention_gluon import LOG2E, _rescale, check_inputs, check_target, flag_set

#: The environment switch that routes ops.attention's forward here (sm_90 only; off by default).
ENV_FLAG = "WAVEFRONT_ATTENTION_FA3"
BLOCK_M = 128  # a program's query tile: two consumer warpgroups x 64 rows (wgmma m64)
BLOCK_N = 128
NUM_WARPS = 4  # the default partition: consumer warpgroup 0
#: K/V ring depth per head dim: 2 at d128 (192 KiB with Q and O), 3 at d64 (128 KiB).
NUM_STAGES = {64: 3, 128: 2}
PRODUCER_REGS = 24  # setmaxnreg of the TMA warp: it holds a few indices
CONSUMER_REGS = 240  # setmaxnreg of consumer warpgroup 1 (S, O, P and the row state of 64 rows x d128)
PINGPONG_BAR = gl.constexpr(14)  # named barriers 14 (consumer 0's turn) and 15 (consumer 1's turn)
N_CONSUMERS = 2


# The schedule. Every decision that the producer and the consumers must agree on (which tile, which key
# blocks, which are masked, which stage and phase) is one of these integer functions; the pipeline model runs
# their Python bodies (`.fn`) so a change here is checked before any GPU sees it.


@gluon.jit
def _tile_coords(tile, n_bh, n_m_blocks, IS_CAUSAL: gl.constexpr):
    """Tile `tile` of the persistent order -> (batch*head, query block). Longest first: causal tiles go by
    query block from the last (every head's last block, then the one before), so the short ones fill the tail."""
    m_block = tile // n_bh
    if IS_CAUSAL:
        m_block = n_m_blocks - 1 - m_block
    return tile % n_bh, m_block


@gluon.jit
def _key_blocks(m_block, seqlen, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(n_unmasked, n_blocks): the tile reads key blocks [0, n_blocks); in [0, n_unmasked) every key is valid
    for every query row of the tile (key < seqlen; causal: key <= the tile's first row), so no mask."""
    start_m = m_block * BLOCK_M
    hi = seqlen
    full = seqlen // BLOCK_N
    if IS_CAUSAL:
        hi = min(start_m + BLOCK_M, seqlen)
        full = min(full, (start_m + 1) // BLOCK_N)
    n_blocks = (hi + BLOCK_N - 1) // BLOCK_N
    return min(full, n_blocks), n_blocks


@gluon.jit
def _kv_stage(count, NUM_STAGES: gl.constexpr):
    """The ring stage of the program's count-th key/value block (counted across its tiles)."""
    return count % NUM_STAGES


@gluon.jit
def _kv_phase(count, NUM_STAGES: gl.constexpr):
    """The parity of the count-th block's phase on its stage's barriers (the stage's (count // NUM_STAGES)-th
    use). Consumers wait *ready* on it; the producer waits *empty* on its complement (a fresh barrier passes a
    wait for parity 1, so the first pass through the ring does not wait)."""
    return (count // NUM_STAGES) & 1


@gluon.jit
def _kv_free_phase(count, NUM_STAGES: gl.constexpr):
    """The parity the producer waits for on the stage's *empty* barrier before copying the count-th block:
    the complement of the consumers' phase, so the ring's first pass does not wait (a fresh barrier passes a
    wait for parity 1) and pass k waits for the consumers' k-th release of the stage."""
    return ((count // NUM_STAGES) & 1) ^ 1


# ---------------------------------------------------------------------------------------------------
# Named barriers (no Gluon op: one inline PTX instruction per thread of the warpgroup; the id and the
# thread count are uniform operands).


@gluon.jit
def _bar_sync(bar_id):
    gl.inline_asm("bar.sync $0, 256;", "r", [bar_id])


@gluon.jit
def _bar_arrive(bar_id):
    gl.inline_asm("bar.arrive $0, 256;", "r", [bar_id])


# ---------------------------------------------------------------------------------------------------
# Partitions.


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
              n_heads, group_size, seqlen, n_m_blocks, n_tiles,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    n_bh = n_tiles // n_m_blocks
    count = 0  # key/value blocks issued by this program so far
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        local = (tile - gl.program_id(0)) // gl.num_programs(0)  # tiles of this program before this one
        bh, m_block = _tile_coords(tile, n_bh, n_m_blocks, IS_CAUSAL)
        b = bh // n_heads
        h = bh % n_heads
        kvh = h // group_size
        n_unmasked, n_blocks = _key_blocks(m_block, seqlen, BLOCK_M, BLOCK_N, IS_CAUSAL)
        mbarrier.wait(q_empty, (local & 1) ^ 1)  # both consumers past the previous tile's last QK^T
        mbarrier.expect(q_ready, q_desc.block_type.nbytes)
        tma.async_load(q_desc, [b, h, m_block * BLOCK_M, 0], q_ready, q_smem)
        for j in range(n_blocks):
            stage = _kv_stage(count + j, NUM_STAGES)
            free = _kv_free_phase(count + j, NUM_STAGES)
            mbarrier.wait(k_empty.index(stage), free)
            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
            tma.async_load(k_desc, [b, kvh, j * BLOCK_N, 0], k_ready.index(stage), k_smem.index(stage))
            mbarrier.wait(v_empty.index(stage), free)
            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
            tma.async_load(v_desc, [b, kvh, j * BLOCK_N, 0], v_ready.index(stage), v_smem.index(stage))
        count += n_blocks


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale, row0, start_n, seqlen, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
             MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """P (fp32), alpha and the new running max and sum for one key block. Every query row sees key 0 in its
    first block (block 0 is always masked-path and valid at key 0), so m is finite after it and exp2(-inf - m)
    is a clean 0."""
    x = s * qk_scale
    if MASKED:
        rows = row0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s_layout))
        cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        valid = gl.expand_dims(cols, 0) < seqlen
        if IS_CAUSAL:
            valid = valid & (gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0))
        x = gl.where(valid, x, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(x, axis=1))
    p = gl.exp2(x - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _tile(ring, stage):
    """Stage `stage` of a [NUM_STAGES, 1, 1, rows, D] ring (TMA's 4-D box) as the [rows, D] wgmma operand."""
    buf = ring.index(stage)
    return buf.reshape([buf.shape[2], buf.shape[3]])


@gluon.jit
def _pv_iteration(c: gl.constexpr, j, count, q_c, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, p, acc,
                  m_i, l_i, qk_scale, row0, seqlen, s_zero, dtype: gl.constexpr, s_layout: gl.constexpr,
                  o_layout: gl.constexpr, p_layout: gl.constexpr, BLOCK_N: gl.constexpr, MASKED: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    """One key-loop iteration of consumer c: enter with P_j (block j = count), leave with P_{j+1}."""
    nxt = count + 1
    _bar_sync(PINGPONG_BAR + c)  # my turn: the other consumer's burst is issued
    mbarrier.wait(k_ready.index(_kv_stage(nxt, NUM_STAGES)), _kv_phase(nxt, NUM_STAGES))
    s = warpgroup_mma(q_c, _tile(k_smem, _kv_stage(nxt, NUM_STAGES)).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    mbarrier.wait(v_ready.index(_kv_stage(count, NUM_STAGES)), _kv_phase(count, NUM_STAGES))
    acc = warpgroup_mma(p, _tile(v_smem, _kv_stage(count, NUM_STAGES)), acc, is_async=True)
    _bar_arrive(PINGPONG_BAR + 1 - c)  # the other consumer's turn
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))  # S_{j+1} done; P_j V_j runs on
    mbarrier.arrive(k_empty.index(_kv_stage(nxt, NUM_STAGES)))
    p_next, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row0, (j + 1) * BLOCK_N, seqlen, s_layout, BLOCK_N,
                                       MASKED, IS_CAUSAL)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(v_empty.index(_kv_stage(count, NUM_STAGES)))
    acc = _rescale(acc, alpha, o_layout)
    return gl.convert_layout(p_next.to(dtype), p_layout), acc, m_i, l_i


@gluon.jit
def _consumer(c: gl.constexpr, o_desc, q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
              v_empty, lse_ptr, stride_lb, stride_lh, n_heads, seqlen, n_m_blocks, n_tiles, qk_scale,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
              NUM_STAGES: gl.constexpr):
    ROWS: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    q_c = q_smem.reshape([BLOCK_M, HEAD_DIM]).slice(c * ROWS, ROWS)
    o_c = o_smem.index(c)
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    n_bh = n_tiles // n_m_blocks

    if c == 1:
        _bar_arrive(PINGPONG_BAR)  # consumer 0 issues first
    count = 0
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        local = (tile - gl.program_id(0)) // gl.num_programs(0)
        bh, m_block = _tile_coords(tile, n_bh, n_m_blocks, IS_CAUSAL)
        n_unmasked, n_blocks = _key_blocks(m_block, seqlen, BLOCK_M, BLOCK_N, IS_CAUSAL)
        row0 = m_block * BLOCK_M + c * ROWS
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.zeros([ROWS], gl.float32, layout=row_layout)
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)

        # S_0 (its own burst), then its softmax on the masked path (block 0 may straddle).
        mbarrier.wait(q_ready, local & 1)
        _bar_sync(PINGPONG_BAR + c)
        mbarrier.wait(k_ready.index(_kv_stage(count, NUM_STAGES)), _kv_phase(count, NUM_STAGES))
        s = warpgroup_mma(q_c, _tile(k_smem, _kv_stage(count, NUM_STAGES)).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        _bar_arrive(PINGPONG_BAR + 1 - c)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(k_empty.index(_kv_stage(count, NUM_STAGES)))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row0, 0, seqlen, s_layout, BLOCK_N, True, IS_CAUSAL)
        p = gl.convert_layout(p.to(dtype), p_layout)

        # The main loop: blocks 1 .. n_unmasked-1 need no mask.
        for j in range(0, n_unmasked - 1):
            p, acc, m_i, l_i = _pv_iteration(c, j, count + j, q_c, k_smem, v_smem, k_ready, k_empty, v_ready,
                                             v_empty, p, acc, m_i, l_i, qk_scale, row0, seqlen, s_zero, dtype,
                                             s_layout, o_layout, p_layout, BLOCK_N, False, IS_CAUSAL, NUM_STAGES)
        # Every straddling block after the first (the causal diagonal, the ragged end).
        for j in range(max(n_unmasked - 1, 0), n_blocks - 1):
            p, acc, m_i, l_i = _pv_iteration(c, j, count + j, q_c, k_smem, v_smem, k_ready, k_empty, v_ready,
                                             v_empty, p, acc, m_i, l_i, qk_scale, row0, seqlen, s_zero, dtype,
                                             s_layout, o_layout, p_layout, BLOCK_N, True, IS_CAUSAL, NUM_STAGES)
        mbarrier.arrive(q_empty)  # every QK^T of the tile has retired: Q's buffer may take the next tile's

        last = count + n_blocks - 1
        _bar_sync(PINGPONG_BAR + c)
        mbarrier.wait(v_ready.index(_kv_stage(last, NUM_STAGES)), _kv_phase(last, NUM_STAGES))
        acc = warpgroup_mma(p, _tile(v_smem, _kv_stage(last, NUM_STAGES)), acc, is_async=True)
        _bar_arrive(PINGPONG_BAR + 1 - c)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(v_empty.index(_kv_stage(last, NUM_STAGES)))

        # Epilogue: O / l through this consumer's own O buffer (the previous tile's store drained first).
        out = _rescale(acc, 1.0 / l_i, o_layout)
        tma.store_wait(pendings=0)
        o_c.reshape([ROWS, HEAD_DIM]).store(out.to(dtype))
        fence_async_shared()
        tma.async_store(o_desc, [bh // n_heads, bh % n_heads, row0, 0], o_c)
        rows = row0 + gl.arange(0, ROWS, layout=row_layout)
        lse = lse_ptr + (bh // n_heads).to(gl.int64) * stride_lb + (bh % n_heads).to(gl.int64) * stride_lh
        gl.store(lse + rows, m_i + gl.log2(l_i), mask=rows < seqlen)
        count += n_blocks
    if c == 0:
        _bar_sync(PINGPONG_BAR)  # consume consumer 1's last arrive: both named barriers end balanced
    tma.store_wait(pendings=0)


@gluon.jit
def _attn_fwd_sm90_fa3(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    batch, n_heads, n_kv_heads, group_size, seqlen, n_m_blocks, n_tiles, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
    NUM_STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):
    gl.static_assert(BLOCK_M == 2 * 64, "two consumer warpgroups of 64 query rows (wgmma m64)")
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_M, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_N, HEAD_DIM], dtype)
    o_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, 1, BLOCK_M // 2, HEAD_DIM], dtype)
    q_desc = tma.make_tensor_descriptor(q_ptr, [batch, n_heads, seqlen, HEAD_DIM], [stride_qb, stride_qh, stride_qs, 1],
                                        [1, 1, BLOCK_M, HEAD_DIM], q_layout)
    k_desc = tma.make_tensor_descriptor(k_ptr, [batch, n_kv_heads, seqlen, HEAD_DIM],
                                        [stride_kb, stride_kh, stride_ks, 1], [1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    v_desc = tma.make_tensor_descriptor(v_ptr, [batch, n_kv_heads, seqlen, HEAD_DIM],
                                        [stride_vb, stride_vh, stride_vs, 1], [1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    o_desc = tma.make_tensor_descriptor(o_ptr, [batch, n_heads, seqlen, HEAD_DIM], [stride_ob, stride_oh, stride_os, 1],
                                        [1, 1, BLOCK_M // 2, HEAD_DIM], o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [1, 1, BLOCK_M, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 1, BLOCK_N, HEAD_DIM], kv_layout)
    o_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M // 2, HEAD_DIM], o_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=2)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_consumer, (0, o_desc, q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                     lse_ptr, stride_lb, stride_lh, n_heads, seqlen, n_m_blocks, n_tiles, qk_scale, HEAD_DIM, BLOCK_M,
                     BLOCK_N, IS_CAUSAL, NUM_STAGES)),
        (_consumer, (1, o_desc, q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                     lse_ptr, stride_lb, stride_lh, n_heads, seqlen, n_m_blocks, n_tiles, qk_scale, HEAD_DIM, BLOCK_M,
                     BLOCK_N, IS_CAUSAL, NUM_STAGES)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, k_empty, v_ready,
                     v_empty, n_heads, group_size, seqlen, n_m_blocks, n_tiles, BLOCK_M, BLOCK_N, IS_CAUSAL,
                     NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---------------------------------------------------------------------------------------------------
# Host side.


WHAT = "the FA3-schedule forward"


def requested() -> bool:
    """Whether the environment asks ops.attention's forward to use this kernel (``WAVEFRONT_ATTENTION_FA3=1``)."""
    return flag_set(ENV_FLAG)


def grid_size(n_tiles: int, n_sms: int) -> int:
    """Persistent grid: one program per SM, never more programs than tiles."""
    return max(1, min(n_tiles, n_sms))


def attention_fwd(q, k, v, causal: bool, scale: float, cu_seqlens=None, *, arch: runtime.Arch | None = None):
    """(o, lse2) exactly as ``kernels.attention.attention_fwd`` returns them: o like q, lse2 [B, H, S] fp32."""
    arch = arch or runtime.arch(q.device)
    check_target(arch, flag=ENV_FLAG, what=WHAT)
    check_inputs(q, k, v, cu_seqlens, what=WHAT)
    B, H, S, D = q.shape
    o = torch.empty_like(q)
    lse2 = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return o, lse2
    n_m_blocks = triton.cdiv(S, BLOCK_M)
    n_tiles = n_m_blocks * B * H
    ensure_descriptor_allocator(q.device)
    launch(
        _attn_fwd_sm90_fa3, (grid_size(n_tiles, runtime.sm_count(q.device)),),
        q_ptr=q, k_ptr=k, v_ptr=v, o_ptr=o, lse_ptr=lse2,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qs=q.stride(2),
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_ks=k.stride(2),
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vs=v.stride(2),
        stride_ob=o.stride(0), stride_oh=o.stride(1), stride_os=o.stride(2),
        stride_lb=lse2.stride(0), stride_lh=lse2.stride(1),
        batch=B, n_heads=H, n_kv_heads=k.shape[1], group_size=H // k.shape[1], seqlen=S, n_m_blocks=n_m_blocks,
        n_tiles=n_tiles, qk_scale=scale * LOG2E,
        constexprs=dict(HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, IS_CAUSAL=causal, NUM_STAGES=NUM_STAGES[D],
                        PRODUCER_REGS=PRODUCER_REGS, CONSUMER_REGS=CONSUMER_REGS),
        options={"num_warps": NUM_WARPS, "num_stages": 1},
    )
    return o, lse2
