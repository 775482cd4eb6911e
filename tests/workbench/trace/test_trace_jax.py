"""jax.profiler traces recorded on this CPU (tests/data/traces/make_jax_traces.py): two JAX processes
training data-parallel with an XLA all-reduce per step, in the TensorBoard profile plugin's layout."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from wavefront.cli.trace import app, expand_paths
from wavefront.workbench.trace import analyze, load_trace
from wavefront.workbench.trace.load import _load_streaming
from wavefront.workbench.trace.multirank import MATCH_XLA_IDENTITY


@pytest.fixture(scope="module")
def jax_paths(data_dir):
    return expand_paths([str(data_dir / "jax_cpu")])


def test_tensorboard_layout_is_found(jax_paths):
    assert [p.name for p in jax_paths] == ["host.trace.json.gz"] * 2
    assert [p.parts[-5] for p in jax_paths] == ["rank0", "rank1"]


def test_breakdown_sums_to_step_wall_time(jax_paths):
    a = analyze(jax_paths)
    for r in a.ranks:
        assert r.domain == "device" and [s.step for s in r.steps] == [0, 1, 2, 3]
        for s in r.steps:
            assert s.total_ns() == s.dur_ns > 0
            assert s.compute_ns > 0 and s.comm_busy_ns > 0  # the XLA ops, and the all-reduce among them
        classes = {k.name: k.cls for k in r.kernels.kernels}
        assert classes["all-reduce"] == "comm" and classes["dot"] == "compute"


def test_multirank_view(jax_paths):
    mr = analyze(jax_paths).multirank
    assert mr.ranks == [0, 1] and [s.step for s in mr.steps] == [0, 1, 2, 3]
    assert mr.n_matched_collectives == 4  # one gradient all-reduce per step
    assert sum(mr.last_arrivals.values()) == 4 and all(w >= 0 for w in mr.wait_total_us.values())
    for s in mr.steps:
        assert s.skew_us == pytest.approx(max(s.dur_us_by_rank.values()) - min(s.dur_us_by_rank.values()), abs=1e-9)


def test_both_readers_agree(jax_paths):
    fast, slow = load_trace(jax_paths[0]), _load_streaming(jax_paths[0], None, None)
    assert fast.device.ts_ns.tolist() == slow.device.ts_ns.tolist()
    assert fast.name_of(fast.cpu.name) == slow.name_of(slow.cpu.name)


def test_cli_on_the_log_directory(data_dir):
    res = CliRunner().invoke(app, ["analyze", str(data_dir / "jax_cpu"), "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["ranks"]) == 2 and doc["multirank"]["n_matched_collectives"] == 4


def test_collectives_matched_by_xla_run_id(jax_paths, tmp_path):
    """XLA ops carry the run id of their program execution, the same on every process: the all-reduces
    are paired by it, so a rank whose trace lacks the first one is still paired right (launch order would
    pair every later instance with the wrong one)."""
    # clocks as written, so that the waits do not depend on which instances are matched (alignment would)
    full = analyze(jax_paths, align="none").multirank
    assert full.matching == MATCH_XLA_IDENTITY and full.n_matched_collectives == 4
    assert not any("launch order" in w for w in full.warnings)
    with gzip.open(jax_paths[1]) as f:
        doc = json.load(f)
    runs = sorted({e["args"]["run_id"] for e in doc["traceEvents"] if e.get("name") == "all-reduce"})
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not (e.get("name") == "all-reduce" and e["args"]["run_id"] == runs[0])]
    cut = tmp_path / "rank1.trace.json"
    cut.write_text(json.dumps(doc))
    mr = analyze([jax_paths[0], cut], align="none").multirank
    assert mr.matching == MATCH_XLA_IDENTITY and mr.n_matched_collectives == 3
    assert any("only some ranks" in w for w in mr.warnings)
    first = full.steps[0].step
    for rank in (0, 1):  # every other step's waits are those of the full pair, to the nanosecond
        assert {k: v for k, v in mr.wait_us[rank].items() if k != first} == \
            {k: v for k, v in full.wait_us[rank].items() if k != first}
