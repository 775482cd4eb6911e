"""Multi-rank: skew, slowest rank, collective waits, clock alignment, mismatched inputs."""

from __future__ import annotations

import random

import pytest

from wavefront.workbench.trace import analyze
from wavefront.workbench.trace.analysis import _multirank
from wavefront.workbench.trace.multirank import MATCH_IDENTITY, MATCH_ORDER
from wavefront.workbench.trace.testing import fsdp_ranks, planted_ranks


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
    assert "steps missing on some ranks (step 5 on rank(s) [2])" in text and "instance counts differ" in text
    assert "matched by launch order per type" in text
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
        assert s.skew_us == pytest.approx(max(s.dur_us_by_rank.values()) - min(s.dur_us_by_rank.values()), abs=1e-9)


@pytest.mark.parametrize("metadata", [True, False])
def test_fsdp_collectives_matched_by_identity(tmp_path, metadata):
    """All-gathers and reduce-scatters start in different orders on the 4 ranks; with the record_param_comms
    identity (or, without it, per-type launch order) every wait and entered-last count is exact, at
    Unix-epoch clocks with ns-resolution offsets between the ranks."""
    planted = fsdp_ranks(4, clock_offsets_ns=[0, 2_500_123, -1_300_777, 40_000_001], metadata=metadata)
    a = analyze(_write(planted.traces, tmp_path))
    orders = {tuple(r.collectives.kinds) for r in a.ranks}
    assert len(orders) > 1  # the planted traces do interleave differently per rank
    mr = a.multirank
    assert mr.matching == (MATCH_IDENTITY if metadata else MATCH_ORDER)
    assert any("launch order per type" in w for w in mr.warnings) is (not metadata)
    assert mr.n_matched_collectives == planted.n_instances
    assert mr.clock_offset_us == {r: -planted.clock_offsets_ns[r] / 1e3 for r in range(4)}
    assert mr.alignment_residual_us == 0.0
    assert mr.wait_us == {r: {k: v / 1e3 for k, v in w.items()} for r, w in planted.wait_ns.items()}
    assert mr.last_arrivals == planted.last_arrivals


def test_start_order_pairing_would_be_wrong(tmp_path):
    """The planted ranks are a real test: pairing every collective by start order regardless of type
    (what keying them all as record_param_comms did) gets different waits."""
    planted = fsdp_ranks(4)
    a = analyze(_write(planted.traces, tmp_path))
    for r in a.ranks:
        c = r.collectives
        c.kinds[:] = ["record_param_comms"] * len(c.kinds)
        c.identities[:] = [None] * len(c.identities)
    mr = _multirank(a.ranks, "auto", [])
    assert mr.wait_us != {r: {k: v / 1e3 for k, v in w.items()} for r, w in planted.wait_ns.items()}


def test_rank_sanity_warnings(tmp_path):
    planted = fsdp_ranks(2)
    paths = _write(planted.traces, tmp_path)
    only0 = analyze(paths[:1])
    assert only0.multirank is None
    assert any("world_size is 2 but 1 rank file(s) were given (rank(s) [0])" in w for w in only0.warnings)
    # rank 1 of another run: other step numbers, a clock 57 ms away
    other = fsdp_ranks(2, seed=5, clock_offsets_ns=[0, 56_800_000])
    for e in other.traces[1].events:
        if e["name"].startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'][13:]) + 100}"
    mixed = analyze([paths[0], other.traces[1].write(tmp_path / "other1.json")])
    text = " ".join(mixed.multirank.warnings)
    assert "share no step" in text and "different runs" in text
    assert mixed.multirank.steps == []
    # same step numbers, but a run with 3 layers per step: its collectives end nowhere near rank 0's
    three = fsdp_ranks(2, seed=5, n_layers=3, clock_offsets_ns=[0, 56_800_000])
    drift = analyze([paths[0], three.traces[1].write(tmp_path / "three1.json")]).multirank
    assert drift.alignment_residual_us > 1000
    assert any("end 1,007.4 us apart after clock alignment" in w and "different runs" in w for w in drift.warnings)


def test_step_finder_is_the_first_listed_window():
    """Collective waits are booked to the first step (in list order) whose window holds the start, as a
    scan would; found by bisection, with overlapping and zero-length windows."""
    from wavefront.workbench.trace.multirank import _step_finder

    rng = random.Random(0)
    steps = [(i, rng.randrange(1000), rng.randrange(40)) for i in range(60)]  # overlapping, some empty
    find = _step_finder(steps)
    for t in range(-5, 1100):
        assert find(t) == next((w[0] for w in steps if w[1] <= t < w[1] + w[2]), "outside steps")
