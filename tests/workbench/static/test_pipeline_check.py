"""The pipeline checker: each rule fires on a planted violation, the shipped Gluon attention schedule passes
the whole grid, and the schedule it replaced (kept here as a fixture) is rejected for the reason it hung."""

from __future__ import annotations

import dataclasses

import pytest

from wavefront.kernels import attention_gluon as ag
from wavefront.workbench.static.pipeline_check import POLICIES, Deadlock, Pipeline, check_grid, run_model
from wavefront.workbench.static.pipeline_models import (
    GLUON_ATTENTION_SCHEDULE,
    MODELS,
    AttentionSchedule,
    attention_grid,
    gluon_attention_fwd,
)

BLOCK = ag.BLOCK


def _kinds(p: Pipeline) -> list[str]:
    return [v.kind for v in p.violations]


# -- the rules, one planted violation each -------------------------------------------------------------


def _two_stage_ring(n_warpgroups: int = 1, n_rows: int = 4 * 128) -> Pipeline:
    p = Pipeline(n_warpgroups)
    p.ring("k", 2, n_rows=n_rows, block_rows=128)
    return p


def test_a_wait_no_copy_will_complete_is_a_deadlock():
    p = _two_stage_ring()
    p.issue("k", 0, 0, at="a")
    p.wait("k", 0, 0, 0, at="b")
    with pytest.raises(Deadlock, match="block 2 was never issued"):
        p.wait("k", 0, 1, 2, at="c")  # stage 0's second use, but nothing was copied into it
    assert _kinds(p) == ["wait-never-satisfied"]
    assert (p.violations[0].ring, p.violations[0].stage, p.violations[0].block) == ("k", 0, 2)


def test_a_wait_on_the_wrong_parity_passes_before_the_copy_lands():
    p = _two_stage_ring()
    p.issue("k", 1, 1, at="a")
    p.wait("k", 1, 1, 1, at="b")  # first use is phase 0
    assert _kinds(p) == ["wait-wrong-phase"]


def test_refill_while_a_matrix_op_may_still_read():
    p = _two_stage_ring()
    p.issue("k", 0, 0, at="a")
    p.wait("k", 0, 0, 0, at="b")
    p.mma([("k", 0, 0)], at="S_0")
    p.issue("k", 0, 2, at="refill before the wait")
    assert _kinds(p) == ["refill-while-read"]
    # Retired by a wait of depth 0: the same refill is fine.
    q = _two_stage_ring()
    q.issue("k", 0, 0, at="a")
    q.wait("k", 0, 0, 0, at="b")
    q.mma([("k", 0, 0)], at="S_0")
    q.mma([("k", 0, 0)], at="S_0 again")
    q.mma_wait(1, at="depth 1 retires only the first")
    q.issue("k", 0, 2, at="refill")
    assert _kinds(q) == ["refill-while-read"] and "S_0 again" in q.violations[0].detail


def test_with_two_warpgroups_a_refill_needs_a_barrier_after_the_wait():
    for barrier in (False, True):
        p = _two_stage_ring(n_warpgroups=2)
        p.issue("k", 0, 0, at="a")
        p.wait("k", 0, 0, 0, at="b")
        p.mma([("k", 0, 0)], at="S_0")
        p.mma_wait(0, at="w")
        if barrier:
            p.barrier(at="bar")
        p.issue("k", 0, 2, at="refill")
        assert _kinds(p) == ([] if barrier else ["refill-while-read"])


def test_a_second_copy_into_a_stage_before_the_first_is_waited():
    p = _two_stage_ring()
    p.issue("k", 0, 0, at="a")
    p.issue("k", 0, 2, at="b")
    assert _kinds(p) == ["refill-before-consumed"]


def test_reads_of_the_wrong_block_or_an_unready_stage():
    p = _two_stage_ring()
    p.issue("k", 0, 0, at="a")
    p.mma([("k", 0, 0)], at="before the wait")
    p.wait("k", 0, 0, 0, at="w")
    p.mma([("k", 0, 2)], at="wrong block")
    p.mma([("k", 1, 1)], at="never filled")
    assert _kinds(p) == ["read-not-ready", "read-wrong-block", "read-not-ready"]


def test_copies_past_the_end_clipped_and_unconsumed():
    p = _two_stage_ring(n_rows=300)  # blocks 0, 1 and a partial block 2 (rows 256..299)
    p.issue("k", 0, 2, at="partial")
    p.issue("k", 1, 3, at="past")
    assert _kinds(p) == ["copy-past-end"] and p.clipped == 1
    p.mma([], at="an op that is never retired")
    p.finish()
    assert _kinds(p) == ["copy-past-end", "copy-not-consumed", "copy-not-consumed", "mma-in-flight-at-exit"]


# -- the Gluon attention forward -----------------------------------------------------------------------


def test_the_model_runs_the_kernels_own_schedule_functions():
    assert GLUON_ATTENTION_SCHEDULE.kv_stage is ag._kv_stage.fn
    assert GLUON_ATTENTION_SCHEDULE.kv_refill is ag._kv_refill.fn
    # Causal: query tile 2 of 1000 tokens reads key blocks 0..2; non-causal all 8 (the last one partial).
    assert GLUON_ATTENTION_SCHEDULE.n_key_blocks(2, 1000, BLOCK, BLOCK, True) == 3
    assert GLUON_ATTENTION_SCHEDULE.n_key_blocks(2, 1000, BLOCK, BLOCK, False) == 8


def test_every_model_passes_its_whole_grid():
    for km in MODELS:
        report = km.check()
        assert report.ok, [str(v) for f in report.failures[:3] for v in f.violations]
        assert report.runs > 2000


def test_the_grid_covers_long_partial_and_every_depth():
    grid = list(attention_grid())
    assert {g["num_stages"] for g in grid} == {1, 2, 3, 4}
    assert {(g["head_dim"], g["num_stages"]) for g in grid} >= {(64, 3), (128, 2)}
    assert max(g["seqlen"] for g in grid) > 12 * BLOCK and min(g["seqlen"] for g in grid) == 1
    run = run_model(gluon_attention_fwd, 2, seqlen=12 * BLOCK + 1, m_block=0, causal=False, num_stages=2)
    assert run.ok and run.issued == 1 + 2 * 13 and run.clipped == 2  # the partial 13th K and V block


def _old_gluon_attention_fwd(p: Pipeline, *, seqlen: int, m_block: int, causal: bool, num_stages: int,
                             head_dim: int = 128) -> None:
    """The schedule before the fix, with its own index arithmetic (inline in the old kernel): the ring's
    first fill 0..NUM_STAGES-1, then in iteration j K_{j+1+NUM_STAGES} and V_{j+NUM_STAGES}; no refill
    after S_0."""
    ns = num_stages
    hi = min(m_block * BLOCK + BLOCK, seqlen) if causal else seqlen
    n = -(-hi // BLOCK)
    for ring, stages in (("q", 1), ("k", ns), ("v", ns)):
        p.ring(ring, stages, n_rows=seqlen, block_rows=BLOCK)
    p.issue("q", 0, m_block, at="prologue")
    for i in range(ns):
        p.issue("k", i % ns, i, i < n, at="prologue")
        p.issue("v", i % ns, i, i < n, at="prologue")
    p.wait("q", 0, 0, m_block, at="prologue")
    p.wait("k", 0, 0, 0, at="prologue")
    p.mma([("q", 0, m_block), ("k", 0, 0)], at="prologue S_0")
    p.mma_wait(0, at="prologue")
    for j in range(n - 1):
        at = f"loop j={j}"
        p.wait("k", (j + 1) % ns, ((j + 1) // ns) & 1, j + 1, at=at)
        p.mma([("q", 0, m_block), ("k", (j + 1) % ns, j + 1)], at=at)
        p.wait("v", j % ns, (j // ns) & 1, j, at=at)
        p.mma([("v", j % ns, j)], at=at)
        p.mma_wait(1, at=at)
        p.barrier(at=at)
        p.issue("k", (j + 1 + ns) % ns, j + 1 + ns, j + 1 + ns < n, at=at)
        p.mma_wait(0, at=at)
        p.barrier(at=at)
        p.issue("v", (j + ns) % ns, j + ns, j + ns < n, at=at)
    last = n - 1
    p.wait("v", last % ns, (last // ns) & 1, last, at="epilogue")
    p.mma([("v", last % ns, last)], at="epilogue")
    p.mma_wait(0, at="epilogue")
    p.barrier(at="epilogue")
    p.write("q", 0, at="epilogue O store")


def test_the_old_schedule_is_rejected_where_it_hung():
    report = check_grid("old", _old_gluon_attention_fwd, attention_grid(), n_warpgroups=2)
    assert not report.ok
    for run in report.failures:
        ns = run.params["num_stages"]
        # Exactly the programs that read more key blocks than the ring holds, each deadlocked on key block
        # NUM_STAGES (stage 0, its second use: parity 1), the first block the schedule never loads.
        (v,) = run.violations
        assert run.deadlocked and v.kind == "wait-never-satisfied"
        assert (v.ring, v.stage, v.block, v.at) == ("k", 0, ns, f"loop j={ns - 1}")
        assert "waits for phase parity 1" in v.detail
    failing = {tuple(sorted(r.params.items())) for r in report.failures}
    for params in attention_grid():
        n = GLUON_ATTENTION_SCHEDULE.n_key_blocks(params["m_block"], params["seqlen"], BLOCK, BLOCK, params["causal"])
        assert (tuple(sorted(params.items())) in failing) == (n > params["num_stages"])
    # At the kernel's own depths: d128 (2 stages) hangs from 3 key blocks, d64 (3 stages) from 4.
    for head_dim, blocks in ((128, 3), (64, 4)):
        ns = ag.NUM_STAGES[head_dim]
        run = run_model(_old_gluon_attention_fwd, 2, seqlen=blocks * BLOCK, m_block=0, causal=False, num_stages=ns)
        assert run.deadlocked
        assert run_model(_old_gluon_attention_fwd, 2, seqlen=(blocks - 1) * BLOCK, m_block=0, causal=False,
                         num_stages=ns).ok


def test_mutations_of_the_shipped_schedule_are_rejected():
    base = GLUON_ATTENTION_SCHEDULE
    params = {"seqlen": 6 * BLOCK + 5, "m_block": 6, "causal": True, "num_stages": 2}
    mutants = {
        "wait-wrong-phase": AttentionSchedule(base.n_key_blocks, base.kv_stage, lambda b, ns: 1 - (b // ns) & 1,
                                              base.kv_refill),
        "refill-before-consumed": AttentionSchedule(base.n_key_blocks, base.kv_stage, base.kv_phase,
                                                    lambda freed, ns: freed + ns + 1),
        "copy-past-end": AttentionSchedule(lambda m, s, bm, bn, c: base.n_key_blocks(m, s, bm, bn, c) + 1,
                                               base.kv_stage, base.kv_phase, base.kv_refill),
    }
    for kind, schedule in mutants.items():
        run = run_model(gluon_attention_fwd, 2, schedule=schedule, **params)
        assert kind in {v.kind for v in run.violations}, (kind, [str(v) for v in run.violations])

    class NoBarrier(Pipeline):  # without the bar.sync Triton puts between each wgmma wait and the next copy
        def barrier(self, *, at: str) -> None:
            pass

    class WaitOneDeeper(Pipeline):  # wgmma waits that leave one more group in flight
        def mma_wait(self, depth: int, *, at: str) -> None:
            super().mma_wait(depth + 1, at=at)

    for pipeline, first_at in ((NoBarrier(2), "prologue"), (WaitOneDeeper(2), "prologue")):
        gluon_attention_fwd(pipeline, **params)
        v = pipeline.violations[0]
        assert (v.kind, v.ring, v.stage, v.block, v.at) == ("refill-while-read", "k", 0, 2, first_at), str(v)


def test_the_static_gate_runs_every_model(monkeypatch):
    from wavefront.workbench.static import gate, pipeline_models

    # The warp-specialized models on their quick grids (the full ones take tens of seconds; the gate runs them).
    quick_grids = {"_attn_fwd_sm90_fa3": pipeline_models.fa3_quick_grid,
                   "_attn_bwd_dkdv_sm100_gluon": pipeline_models.bwd_dkdv_quick_grid}
    quick = tuple(dataclasses.replace(m, grid=quick_grids[m.kernel], policies=POLICIES[:3])
                  if isinstance(m, pipeline_models.WsKernelModel) else m for m in pipeline_models.MODELS)
    monkeypatch.setattr(pipeline_models, "MODELS", quick)
    half = gate.check_pipelines(gate.HalfResult("static"))
    assert half.passed and half.notes == ["pipeline model _attn_fwd_sm90_gluon: 2470 programs, every rule holds",
                                          "pipeline model _attn_fwd_sm90_fa3: 360 programs, every rule holds",
                                          "pipeline model _attn_bwd_dkdv_sm100_gluon: 216 programs, every rule "
                                          "holds"]
    old = pipeline_models.KernelModel("old_gluon", _old_gluon_attention_fwd, attention_grid, 2)
    monkeypatch.setattr(pipeline_models, "MODELS", (old,))
    (finding,) = gate.check_pipelines(gate.HalfResult("static")).findings
    assert finding.rule == "pipeline" and finding.subject == "old_gluon"
    assert "wait-never-satisfied" in finding.message and "k[0] block" in finding.message
