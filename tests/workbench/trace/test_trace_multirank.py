"""Multi-rank: skew, slowest rank, collective waits, clock alignment, mismatched inputs."""

from __future__ import annotations

import pytest

from wavefront.workbench.trace import analyze
from wavefront.workbench.trace.synth import planted_ranks


def _write(traces, tmp_path):
    return [t.write(tmp_path / f"rank{i}.json") for i, t in enumerate(traces)]


def test_planted_offsets_skew_and_waits(tmp_path):
    offsets = [0.0, 2500.0, -1300.0]
    a = analyze(_write(planted_ranks(offsets, late_rank=2), tmp_path))
    mr = a.multirank
    assert mr.alignment.startswith("collective ends")
    assert mr.clock_offset_us == {0: 0.0, 1: -2500.0, 2: 1300.0}
    assert mr.alignment_residual_us == pytest.approx(0.0, abs=1e-6)
    assert mr.n_matched_collectives == 5
    assert [s.step for s in mr.steps] == [1, 2, 3, 4, 5]
    for s in mr.steps:
        assert s.dur_us_by_rank == {0: 900.0, 1: 950.0, 2: 1000.0}
        assert (s.skew_us, s.slowest_rank, s.fastest_rank) == (100.0, 2, 0)
    assert mr.wait_us[0] == {k: pytest.approx(100.0) for k in range(1, 6)}
    assert mr.wait_total_us[1] == pytest.approx(500.0) and mr.wait_total_us[2] == 0.0
    assert mr.last_arrivals == {0: 0, 1: 0, 2: 5}


def test_shared_host_keeps_clock_and_none_mode(tmp_path):
    traces = planted_ranks([0.0, 0.0], late_rank=0, same_host=True)
    a = analyze(_write(traces, tmp_path))
    assert a.multirank.alignment.startswith("shared clock") and a.multirank.clock_offset_us == {0: 0.0, 1: 0.0}
    assert a.multirank.wait_total_us == {0: 0.0, 1: pytest.approx(500.0)}
    skewed = planted_ranks([0.0, 40.0], late_rank=0)
    b = analyze(_write(skewed, tmp_path), align="none")
    assert b.multirank.clock_offset_us == {0: 0.0, 1: 0.0} and b.multirank.alignment_residual_us == 40.0


def test_mismatched_inputs_warn_and_keep_going(tmp_path):
    traces = planted_ranks([0.0, 0.0, 0.0], late_rank=1)
    traces[2].events = [e for e in traces[2].events if e.get("name") != "ProfilerStep#5"]
    last_coll = max(i for i, e in enumerate(traces[2].events) if e.get("cat") == "kernel"
                    and e["args"]["stream"] == 20)
    del traces[2].events[last_coll]
    a = analyze(_write(traces, tmp_path)[:3])
    text = " ".join(a.multirank.warnings)
    assert "different steps" in text and "instance counts differ" in text
    assert [s.step for s in a.multirank.steps] == [1, 2, 3, 4]
    two = analyze([tmp_path / "rank0.json", tmp_path / "rank1.json"])
    assert any("world_size is 3 but 2 rank file(s)" in w for w in two.warnings)
    dup = analyze([tmp_path / "rank0.json", tmp_path / "rank0.json"])
    assert dup.multirank is None and any("more than one file" in w for w in dup.warnings)


def test_real_gloo_pair(data_dir):
    a = analyze([data_dir / "gloo_rank0.json.gz", data_dir / "gloo_rank1.json.gz"])
    mr = a.multirank
    assert mr.ranks == [0, 1] and mr.alignment.startswith("shared clock")
    assert mr.n_matched_collectives >= 6  # at least one gradient all-reduce per profiled step
    assert sum(mr.last_arrivals.values()) == mr.n_matched_collectives
    assert all(w >= 0 for w in mr.wait_total_us.values())
    assert [s.step for s in mr.steps] == [1, 2, 3, 4, 5, 6]
    for s in mr.steps:
        assert s.skew_us == max(s.dur_us_by_rank.values()) - min(s.dur_us_by_rank.values())
