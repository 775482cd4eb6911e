"""Executable models of the kernels that manage their own asynchronous copies and barriers, for
:mod:`wavefront.workbench.static.pipeline_check`.

A model walks one program of its kernel in program order and reports every pipeline event. Every index it
uses comes from the kernel's own schedule functions (their Python bodies, ``.fn``, run on ints); what is
written here is only the order of the calls, which the kernel's compile test checks against the machine code
(TMA loads before and inside the main loop, a bar.sync between each wgmma wait and the next TMA copy).

Adding a hand-pipelined kernel: write its model beside these and add a :class:`KernelModel` to ``MODELS``;
``tests/workbench/static/test_pipeline_check.py`` runs every entry over its grid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from wavefront.kernels import attention_bwd_gluon as bwdg
from wavefront.kernels import attention_fa3 as fa3
from wavefront.kernels import attention_gluon as ag
from wavefront.workbench.static.pipeline_check import (
    POLICIES,
    GridReport,
    Pipeline,
    WarpSpecialized,
    check_grid,
    check_ws_grid,
)


def _python(f: Callable) -> Callable:
    """The Python body of a @gluon.jit / @triton.jit helper (it runs on ints as written)."""
    return getattr(f, "fn", f)


@dataclass(frozen=True)
class AttentionSchedule:
    """The schedule functions of the Gluon attention forward (see the kernel's helpers of the same names)."""

    n_key_blocks: Callable[[int, int, int, int, bool], int]
    kv_stage: Callable[[int, int], int]
    kv_phase: Callable[[int, int], int]
    kv_refill: Callable[[int, int], int]


#: The shipped kernel's schedule: its own helpers' Python bodies.
GLUON_ATTENTION_SCHEDULE = AttentionSchedule(_python(ag._n_key_blocks), _python(ag._kv_stage), _python(ag._kv_phase),
                                             _python(ag._kv_refill))


def gluon_attention_fwd(p: Pipeline, *, seqlen: int, m_block: int, causal: bool, num_stages: int,
                        head_dim: int = 128, block: int = ag.BLOCK,
                        schedule: AttentionSchedule = GLUON_ATTENTION_SCHEDULE) -> None:
    """One program (query tile m_block) of ``_attn_fwd_sm90_gluon``, event for event in program order.

    Barriers: Triton's shared-memory barrier pass puts a bar.sync between each wgmma wait and the next TMA
    copy into a stage the wgmma read (tests/kernels/test_attention_gluon.py checks it in the PTX), and the
    kernel's own gl.barrier() precedes O's store into Q's buffer."""
    del head_dim  # the schedule does not depend on it beyond num_stages (NUM_STAGES[head_dim])
    sch, ns = schedule, num_stages
    n = sch.n_key_blocks(m_block, seqlen, block, block, causal)
    for ring, stages in (("q", 1), ("k", ns), ("v", ns)):
        p.ring(ring, stages, n_rows=seqlen, block_rows=block)

    def load(ring: str, b: int, at: str) -> None:  # _load_kv
        p.issue(ring, sch.kv_stage(b, ns), b, b < n, at=at)

    def wait(ring: str, b: int, at: str) -> None:  # _wait_kv
        p.wait(ring, sch.kv_stage(b, ns), sch.kv_phase(b, ns), b, at=at)

    def qk(b: int, at: str) -> None:
        p.mma([("q", 0, m_block), ("k", sch.kv_stage(b, ns), b)], at=at)

    def pv(b: int, at: str) -> None:
        p.mma([("v", sch.kv_stage(b, ns), b)], at=at)

    at = "prologue"
    p.issue("q", 0, m_block, at=at)
    for i in range(ns):
        load("k", i, at)
        load("v", i, at)
    p.wait("q", 0, 0, m_block, at=at)
    wait("k", 0, at)
    qk(0, "prologue S_0")
    p.mma_wait(0, at=at)
    p.barrier(at=at)
    load("k", sch.kv_refill(0, ns), at)
    for j in range(n - 1):
        at = f"loop j={j}"
        wait("k", j + 1, at)
        qk(j + 1, f"{at} S_{j + 1}")
        wait("v", j, at)
        pv(j, f"{at} PV_{j}")
        p.mma_wait(1, at=at)
        p.barrier(at=at)
        load("k", sch.kv_refill(j + 1, ns), at)
        p.mma_wait(0, at=at)
        p.barrier(at=at)
        load("v", sch.kv_refill(j, ns), at)
    at = "epilogue"
    wait("v", n - 1, at)
    pv(n - 1, f"{at} PV_{n - 1}")
    p.mma_wait(0, at=at)
    p.barrier(at=at)
    p.write("q", 0, at=f"{at} O store")


def attention_grid(max_blocks: int = 12, stages: tuple[int, ...] = (1, 2, 3, 4)) -> Iterator[dict]:
    """Every (sequence length, head_dim, ring depth, causal, query tile): lengths 1 and k*BLOCK - 1, k*BLOCK,
    k*BLOCK + 1 for k = 1..max_blocks (full and partial last blocks); the kernel's head dims with their ring
    depth (NUM_STAGES), and every depth in `stages` at head_dim 128 (the schedule must hold at any depth)."""
    lengths = sorted({1} | {k * ag.BLOCK + r for k in range(1, max_blocks + 1) for r in (-1, 0, 1)})
    depths = sorted({(d, ag.NUM_STAGES[d]) for d in ag.HEAD_DIMS} | {(128, s) for s in stages})
    for head_dim, ns in depths:
        for causal in (False, True):
            for seqlen in lengths:
                for m_block in range(-(-seqlen // ag.BLOCK)):
                    yield {"seqlen": seqlen, "m_block": m_block, "causal": causal, "num_stages": ns,
                           "head_dim": head_dim}


# ---------------------------------------------------------------------------------------------------
# The FA3-schedule forward (kernels/attention_fa3.py): a producer and two consumer warpgroups per program.


@dataclass(frozen=True)
class Fa3Schedule:
    """The schedule functions of the FA3-schedule forward (the kernel's helpers of the same names)."""

    tile_coords: Callable[[int, int, int, bool], tuple[int, int]]
    key_blocks: Callable[[int, int, int, int, bool], tuple[int, int]]
    kv_stage: Callable[[int, int], int]
    kv_phase: Callable[[int, int], int]
    kv_free_phase: Callable[[int, int], int]


FA3_SCHEDULE = Fa3Schedule(_python(fa3._tile_coords), _python(fa3._key_blocks), _python(fa3._kv_stage),
                           _python(fa3._kv_phase), _python(fa3._kv_free_phase))


def fa3_attention_fwd(ws: WarpSpecialized, *, seqlen: int, n_bh: int, causal: bool, num_stages: int,
                      n_programs: int, pid: int, block_m: int = fa3.BLOCK_M, block_n: int = fa3.BLOCK_N,
                      schedule: Fa3Schedule = FA3_SCHEDULE, pre_arrive: bool = True,
                      release_before_wait: bool = False) -> dict:
    """Program `pid` of ``_attn_fwd_sm90_fa3`` on a grid of `n_programs`: the producer and the two consumers as
    event generators, each in its partition's program order. The two keyword flags below `schedule` break the
    protocol on purpose (the checker's negative tests): no opening arrive of consumer 1 on consumer 0's turn
    barrier, and a consumer marking K's and V's stages free before the waits that retire its wgmmas."""
    sch, ns, bar = schedule, num_stages, int(fa3.PINGPONG_BAR)
    n_m_blocks = -(-seqlen // block_m)
    n_tiles = n_m_blocks * n_bh
    tiles = range(pid, n_tiles, n_programs)
    ws.ring("q", 1)
    ws.ring("k", ns, n_rows=seqlen)
    ws.ring("v", ns, n_rows=seqlen)
    ws.mbarrier("q_ready", 1)
    ws.mbarrier("q_empty", 2, releases=("q", 0))
    for i in range(ns):
        for r in ("k", "v"):
            ws.mbarrier(f"{r}_ready{i}", 1)
            ws.mbarrier(f"{r}_empty{i}", 2, releases=(r, i))

    def blocks(tile: int) -> tuple[int, int, int]:
        bh, m_block = sch.tile_coords(tile, n_bh, n_m_blocks, causal)
        n_unmasked, n_blocks = sch.key_blocks(m_block, seqlen, block_m, block_n, causal)
        assert 0 <= n_unmasked <= n_blocks, (n_unmasked, n_blocks)
        return bh, m_block, n_blocks

    def producer():
        count = 0
        for local, tile in enumerate(tiles):
            bh, m_block, n_blocks = blocks(tile)
            at = f"producer tile {tile}"
            yield ("wait", "q_empty", (local & 1) ^ 1, at)
            yield ("copy", "q", 0, tile, "q_ready", m_block * block_m, at)
            for j in range(n_blocks):
                st, free = sch.kv_stage(count + j, ns), sch.kv_free_phase(count + j, ns)
                for r in ("k", "v"):
                    yield ("wait", f"{r}_empty{st}", free, f"{at} {r}{j}")
                    yield ("copy", r, st, (bh, j), f"{r}_ready{st}", j * block_n, f"{at} {r}{j}")
            count += n_blocks

    def consumer(c: int):
        me, other = bar + c, bar + 1 - c

        def wait(r: str, n: int, at: str):
            return ("wait", f"{r}_ready{sch.kv_stage(n, ns)}", sch.kv_phase(n, ns), at)

        def release(r: str, n: int, at: str):
            return ("arrive", f"{r}_empty{sch.kv_stage(n, ns)}", at)

        if c == 1 and pre_arrive:
            yield ("bar_arrive", bar, "consumer 1 start")
        count = 0
        for local, tile in enumerate(tiles):
            bh, m_block, n_blocks = blocks(tile)
            at = f"consumer {c} tile {tile}"
            yield ("wait", "q_ready", local & 1, at)
            yield ("bar_sync", me, at)
            yield ("burst", at)
            yield wait("k", count, at)
            yield ("mma", [("q", 0, tile), ("k", sch.kv_stage(count, ns), (bh, 0))], f"{at} S_0")
            yield ("bar_arrive", other, at)
            yield ("mma_wait", 0, at)
            yield release("k", count, at)
            for j in range(n_blocks - 1):  # the unmasked and the masked loop: the same events
                it, nxt = count + j, count + j + 1
                a = f"{at} j={j}"
                yield ("bar_sync", me, a)
                yield ("burst", a)
                yield wait("k", nxt, a)
                yield ("mma", [("q", 0, tile), ("k", sch.kv_stage(nxt, ns), (bh, j + 1))], f"{a} S_{j + 1}")
                yield wait("v", it, a)
                yield ("mma", [("v", sch.kv_stage(it, ns), (bh, j))], f"{a} PV_{j}")
                if release_before_wait:
                    yield release("k", nxt, a)
                    yield release("v", it, a)
                yield ("bar_arrive", other, a)
                yield ("mma_wait", 1, a)
                if not release_before_wait:
                    yield release("k", nxt, a)
                yield ("mma_wait", 0, a)
                if not release_before_wait:
                    yield release("v", it, a)
            yield ("arrive", "q_empty", at)
            last = count + n_blocks - 1
            yield ("bar_sync", me, at)
            yield ("burst", at)
            yield wait("v", last, at)
            yield ("mma", [("v", sch.kv_stage(last, ns), (bh, n_blocks - 1))], f"{at} PV_last")
            yield ("bar_arrive", other, at)
            yield ("mma_wait", 0, at)
            yield release("v", last, at)
            count += n_blocks
        if c == 0:
            yield ("bar_sync", bar, "consumer 0 end")

    return {"producer": producer(), "consumer0": consumer(0), "consumer1": consumer(1)}


def fa3_grid(lengths: tuple[int, ...] = (1, 64, 127, 128, 129, 255, 256, 257, 385, 640),
             programs: tuple[int, ...] = (1, 2, 5), n_bh: tuple[int, ...] = (1, 3)) -> Iterator[dict]:
    """Sequence lengths (one row, partial and full last tiles, 1..several key blocks), causal and not, the
    kernel's ring depths and deeper ones, BLOCK_N = 128 (one diagonal block per tile) and 64 (two straddling
    blocks per causal tile), grids of one program and of more programs than tiles (programs with no tile)."""
    for block_n, stages in ((128, sorted({*fa3.NUM_STAGES.values(), 4})), (64, [2, 3])):
        for ns in stages:
            for causal in (False, True):
                for seqlen in lengths:
                    for bh in n_bh:
                        for n_programs in programs:
                            for pid in range(n_programs):
                                yield {"seqlen": seqlen, "n_bh": bh, "causal": causal, "num_stages": ns,
                                       "n_programs": n_programs, "pid": pid, "block_n": block_n}


def fa3_quick_grid() -> Iterator[dict]:
    """A few seconds' worth of :func:`fa3_grid` for the default test run (the full grid is the slow test)."""
    return fa3_grid(lengths=(1, 129, 385), programs=(1, 3), n_bh=(2,))


@dataclass(frozen=True)
class WsKernelModel:
    """A warp-specialized kernel's model, its configuration grid and the scheduling policies it runs under."""

    kernel: str
    model: Callable[..., dict]
    grid: Callable[[], Iterator[dict]]
    policies: tuple[str, ...] = POLICIES

    def check(self) -> GridReport:
        return check_ws_grid(self.kernel, self.model, self.grid(), self.policies)


@dataclass(frozen=True)
class KernelModel:
    """A hand-pipelined kernel's model, its configuration grid and its warpgroups per program."""

    kernel: str
    model: Callable[..., None]
    grid: Callable[[], Iterator[dict]]
    n_warpgroups: int

    def check(self) -> GridReport:
        return check_grid(self.kernel, self.model, self.grid(), self.n_warpgroups)


# ---------------------------------------------------------------------------------------------------
# The sm_100 dK/dV backward (kernels/attention_bwd_gluon.py): a loader warp and the compute partition.


@dataclass(frozen=True)
class BwdSchedule:
    """The schedule functions of the Gluon sm_100 dK/dV kernel (the kernel's helpers of the same names)."""

    first_row: Callable[[int, bool], int]
    n_tiles: Callable[[int, int, int], int]
    tile_head: Callable[[int, int], int]
    tile_row: Callable[[int, int, int, int], int]
    stage: Callable[[int, int], int]
    ready_phase: Callable[[int, int], int]
    empty_phase: Callable[[int, int], int]
    mma_phase: Callable[[int], int]


BWD_SCHEDULE = BwdSchedule(_python(bwdg._bwd_first_row), _python(bwdg._bwd_n_tiles), _python(bwdg._bwd_tile_head),
                           _python(bwdg._bwd_tile_row), _python(bwdg._bwd_stage), _python(bwdg._bwd_ready_phase),
                           _python(bwdg._bwd_empty_phase), _python(bwdg._bwd_mma_phase))


def gluon_attention_bwd_dkdv(ws: WarpSpecialized, *, seqlen: int, n_block: int, causal: bool, group_size: int,
                             num_stages: int, head_dim: int = 128, block_m: int = bwdg.BLOCK_M,
                             block_n: int = bwdg.BLOCK_N, schedule: BwdSchedule = BWD_SCHEDULE,
                             release_before_dk: bool = False) -> dict:
    """Program `n_block` (key tile) of ``_attn_bwd_dkdv_sm100_gluon``: the loader and the compute partition as
    event generators, each in its program order. A tcgen05 product whose completion arrives on an mbarrier
    (``mbarriers=[...]``: a commit of every earlier product of the issuing thread) is modeled as a wait that
    retires every product in flight followed by the arrive: the arrive is when they are done, and no partition
    acts on them before it. The compute partition's one barrier per iteration orders its own threads only (the
    tensor-memory and P^T / dS^T buffers, which this model does not track). `release_before_dk` breaks the
    protocol on purpose (a negative test): the stage's empty barrier signalled by the dV product, before dK has
    been issued on the stage's Q."""
    del head_dim  # the schedule does not depend on it beyond num_stages (NUM_STAGES[head_dim])
    sch, ns = schedule, num_stages
    start_n = n_block * block_n
    lo = sch.first_row(start_n, causal)
    n_tiles = sch.n_tiles(seqlen, lo, block_m)
    n_iters = group_size * n_tiles
    ws.ring("k", 1, n_rows=seqlen)
    ws.ring("v", 1, n_rows=seqlen)
    ws.ring("q", ns, n_rows=seqlen)
    ws.ring("do", ns, n_rows=seqlen)
    ws.mbarrier("kv", 2)  # one expect-tx for both copies: complete when both land
    ws.mbarrier("mma", 1)
    for i in range(ns):
        ws.mbarrier(f"ready{i}", 2)
        ws.mbarrier(f"empty{i}", 1, releases=("q", i))

    def tile(j: int) -> tuple[int, int]:
        return sch.tile_head(j, n_tiles), sch.tile_row(j, n_tiles, lo, block_m)

    def loader():
        yield ("copy", "k", 0, n_block, "kv", start_n, "loader K")
        yield ("copy", "v", 0, n_block, "kv", start_n, "loader V")
        for j in range(n_iters):
            st, at = sch.stage(j, ns), f"loader tile {j}"
            yield ("wait", f"empty{st}", sch.empty_phase(j, ns), at)
            yield ("copy", "q", st, tile(j), f"ready{st}", tile(j)[1], at)
            yield ("copy", "do", st, tile(j), f"ready{st}", tile(j)[1], at)

    def commit(bar: str, at: str):  # a product's mbarrier completion (see the docstring)
        yield ("mma_wait", 0, at)
        yield ("arrive", bar, at)

    def scores(j: int, at: str):  # _issue_scores: S^T_j, dP^T_j; dP^T's completion on the MMA barrier
        st = sch.stage(j, ns)
        yield ("wait", f"ready{st}", sch.ready_phase(j, ns), at)
        yield ("mma", [("k", 0, n_block), ("q", st, tile(j))], f"{at} S^T_{j}")
        yield ("mma", [("v", 0, n_block), ("do", st, tile(j))], f"{at} dP^T_{j}")
        yield from commit("mma", at)

    def compute():
        yield ("wait", "kv", 0, "compute K/V")
        yield from scores(0, "prologue")
        for j in range(n_iters):
            st, at = sch.stage(j, ns), f"compute j={j}"
            yield ("wait", "mma", sch.mma_phase(j), at)
            yield ("mma", [("do", st, tile(j))], f"{at} dV")
            if release_before_dk:
                yield from commit(f"empty{st}", f"{at} dV")
            yield ("mma", [("q", st, tile(j))], f"{at} dK")
            last = j + 1 == n_iters
            if not release_before_dk:
                yield from commit(f"empty{st}", f"{at} dK")
            if last:
                yield ("arrive", "mma", f"{at} dK")  # the same completion, on the MMA barrier (epilogue)
            else:
                yield from scores(j + 1, at)
        yield ("wait", "mma", sch.mma_phase(n_iters), "epilogue")

    return {"producer": loader(), "consumer": compute()}


def bwd_dkdv_grid(lengths: tuple[int, ...] = (1, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257, 383, 385),
                  groups: tuple[int, ...] = (1, 2, 4), stages: tuple[int, ...] = (1, 2, 3, 4)) -> Iterator[dict]:
    """Every key tile of sequence lengths around multiples of BLOCK_M (64) and BLOCK_N (128), causal and not,
    GQA groups of 1, 2 and 4 query heads per K/V head, the kernel's head dims at their ring depth and every depth
    in `stages` at head_dim 128 (the schedule must hold at any depth, one stage included)."""
    depths = sorted({(d, bwdg.NUM_STAGES[d]) for d in bwdg.NUM_STAGES} | {(128, s) for s in stages})
    for head_dim, ns in depths:
        for causal in (False, True):
            for seqlen in lengths:
                for group_size in groups:
                    for n_block in range(-(-seqlen // bwdg.BLOCK_N)):
                        yield {"seqlen": seqlen, "n_block": n_block, "causal": causal, "group_size": group_size,
                               "num_stages": ns, "head_dim": head_dim}


def bwd_dkdv_quick_grid() -> Iterator[dict]:
    """A few seconds' worth of :func:`bwd_dkdv_grid` for the default test run (the full grid is the gate's)."""
    return bwd_dkdv_grid(lengths=(1, 129, 257), groups=(1, 2), stages=(1, 2))


MODELS: tuple[KernelModel | WsKernelModel, ...] = (
    KernelModel("_attn_fwd_sm90_gluon", gluon_attention_fwd, attention_grid, ag.NUM_WARPS // 4),
    WsKernelModel("_attn_fwd_sm90_fa3", fa3_attention_fwd, fa3_grid),
    WsKernelModel("_attn_bwd_dkdv_sm100_gluon", gluon_attention_bwd_dkdv, bwd_dkdv_grid),
)
