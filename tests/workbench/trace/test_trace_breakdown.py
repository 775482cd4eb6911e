"""The per-step breakdown: planted exact numbers, exact sums, CPU-only traces, missing step markers."""

from __future__ import annotations

import pytest

from wavefront.workbench.trace import analyze, load_trace
from wavefront.workbench.trace.breakdown import CATEGORIES, build_timeline, find_steps, step_breakdowns
from wavefront.workbench.trace.testing import PLANTED_STEP1_US, PLANTED_STEP2_US, SynthTrace, planted_gpu_trace

# Planted in testing.planted_gpu_trace, worked out by hand there (microseconds).
STEP1, STEP2 = PLANTED_STEP1_US, PLANTED_STEP2_US


def test_planted_steps_exact(planted_path):
    steps, notes = step_breakdowns(load_trace(planted_path))
    assert [s.step for s in steps] == [1, 2]
    for s, expected in zip(steps, (STEP1, STEP2), strict=True):
        assert s.domain == "device" and s.dur_ns == 1_000_000
        assert {c: s.us(c) for c in CATEGORIES} == expected
        assert s.total_ns() == s.dur_ns
    assert notes == []


def test_sync_record_is_not_busy(tmp_path):
    """The cuda_sync record spanning [850, 900) must leave that gap idle (HTA PR #162 counted it)."""
    steps, _ = step_breakdowns(load_trace(planted_gpu_trace().write(tmp_path / "p.json")))
    assert steps[0].us("idle_other") == 50


def test_no_step_markers_whole_trace(tmp_path):
    t = SynthTrace()
    t.launch("k0", 100, 50, launch_ts=10)
    t.launch("k1", 200, 50, launch_ts=175)  # launched after the device went idle at 150: host-bound
    t.launch("k2", 300, 100, launch_ts=180)  # queued before the gap at 250: other
    trace = load_trace(t.write(tmp_path / "n.json"))
    steps, note = find_steps(trace)
    assert note and "one step" in note
    (s,), _ = step_breakdowns(trace)
    assert s.step is None and s.dur_us == 300
    assert (s.us("compute"), s.us("idle_host_bound"), s.us("idle_other")) == (200, 50, 50)


def test_trailing_idle_without_later_work_is_other(tmp_path):
    t = SynthTrace()
    t.step(1, 0, 1000)
    t.launch("k", 0, 100, launch_ts=0, launch_dur=0)
    (s,), _ = step_breakdowns(load_trace(t.write(tmp_path / "t.json")))
    assert (s.us("compute"), s.us("idle_host_bound"), s.us("idle_other")) == (100, 0, 900)


def test_cpu_only_real_trace_sums_exactly(data_dir):
    trace = load_trace(data_dir / "cpu_train_h64.json.gz")
    steps, notes = step_breakdowns(trace)
    assert len(steps) == 20 and any("CPU-only" in n for n in notes)
    for s in steps:
        assert s.domain == "cpu" and s.total_ns() == s.dur_ns
        assert s.us("compute") > 0 and s.us("comm_exposed") == 0 and s.us("idle_host_bound") == 0


def test_gloo_trace_has_communication(data_dir):
    trace = load_trace(data_dir / "gloo_rank0.json.gz")
    timeline = build_timeline(trace)
    assert timeline.domain == "cpu" and timeline.comm.measure() > 0
    steps, _ = step_breakdowns(trace, timeline)
    assert sum(s.comm_busy_ns for s in steps) > 0
    assert all(s.total_ns() == s.dur_ns for s in steps)


def test_analysis_totals_are_sums_of_steps(planted_path):
    r = analyze([planted_path]).ranks[0]
    totals = r.totals()
    assert totals["step_us"] == 2000
    assert totals["compute_us"] == 740 and totals["idle_other_us"] == 360
    assert sum(totals[f"{c}_us"] for c in CATEGORIES) == pytest.approx(totals["step_us"], abs=1e-9)


def test_all_steps_at_once_equals_step_by_step(tmp_path, data_dir):
    """Timeline.breakdowns (prefix sums over the whole timeline) gives the same integers as breakdown()
    per step, on planted, generated, FSDP-like and real (CPU, gloo, jax) traces."""
    from wavefront.workbench.trace.testing import fsdp_ranks, write_large_trace

    write_large_trace(tmp_path / "large.json", 300_000, seed=4)
    paths = [planted_gpu_trace().write(tmp_path / "p.json"), fsdp_ranks(2).traces[1].write(tmp_path / "f.json"),
             tmp_path / "large.json", data_dir / "cpu_train_h64.json.gz", data_dir / "gloo_rank1.json.gz",
             data_dir / "jax_cpu" / "rank0" / "plugins" / "profile" / "run" / "host.trace.json.gz"]
    for path in paths:
        trace = load_trace(path)
        timeline = build_timeline(trace)
        steps, _ = find_steps(trace)
        assert len(steps) > 0
        assert timeline.breakdowns(steps) == [timeline.breakdown(s) for s in steps], path
