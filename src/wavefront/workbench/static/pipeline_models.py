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

from wavefront.kernels import attention_gluon as ag
from wavefront.workbench.static.pipeline_check import GridReport, Pipeline, check_grid


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


@dataclass(frozen=True)
class KernelModel:
    """A hand-pipelined kernel's model, its configuration grid and its warpgroups per program."""

    kernel: str
    model: Callable[..., None]
    grid: Callable[[], Iterator[dict]]
    n_warpgroups: int

    def check(self) -> GridReport:
        return check_grid(self.kernel, self.model, self.grid(), self.n_warpgroups)


MODELS: tuple[KernelModel, ...] = (
    KernelModel("_attn_fwd_sm90_gluon", gluon_attention_fwd, attention_grid, ag.NUM_WARPS // 4),
)
