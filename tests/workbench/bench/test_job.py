"""The bench and gate jobs as library calls: what the quick CPU sweep selects, run marking, gate policy."""

from __future__ import annotations

import json

import pytest

from wavefront.ops import REGISTRY
from wavefront.workbench.bench import compare
from wavefront.workbench.bench.records import RunInfo, StoredRun
from wavefront.workbench.bench.store import ResultStore
from wavefront.workbench.jobs import bench as job
from wavefront.workbench.jobs.gate import GateRequest, split_baselines
from wavefront.workbench.jobs.request import RequestError
from wavefront.workbench.jobs.traffic import QUICK_TRAFFIC_MAX_BYTES, quick_traffic_cases


def test_quick_sweep_is_one_case_per_op_and_dtype():
    p = job.plan(job.BenchRequest(device="cpu"))
    assert p.quick and not p.timing_items
    expected = sum(len(spec.dtypes) for spec in REGISTRY.values())
    assert len(p.checks) == expected
    assert {(s.name, d) for s, _, d in p.checks} == {(n, d) for n, s in REGISTRY.items() for d in s.dtypes}
    assert {c.name for s, c, _ in p.checks if s.name == "softmax"} == {"npow2"}
    assert any("--full" in line for line in p.describe()) and any("min" in line for line in p.describe())


def test_full_sweep_checks_every_non_slow_case():
    p = job.plan(job.BenchRequest(device="cpu", full=True, op=("softmax",)))
    spec = REGISTRY["softmax"]
    assert not p.quick and len(p.checks) == len([c for c in spec.cases if not c.slow]) * len(spec.dtypes)


@pytest.mark.parametrize(("changes", "argument"), [
    ({"case": ("no_such_case",)}, "case"), ({"case": ("llama3-8b_hidden",), "op": ("rms_norm",)}, "case"),
    ({"op": ("nope",)}, "op"), ({"mode": ("up",)}, "mode"),
    ({"dtype": ("fp8",)}, "dtype"), ({"reps": 0}, "reps"), ({"device_model": "tpu"}, "device_model"),
    ({"inspect_targets": ("sm_75",)}, "inspect_targets"),
])
def test_bad_request_names_its_field(changes, argument):
    with pytest.raises(RequestError) as info:
        job.plan(job.BenchRequest(device="cpu", **changes))
    assert info.value.argument == argument


def test_quick_traffic_case_stays_small():
    """linear_cross_entropy's first traffic case moves about 1 GB (133 s and 4.5 GB to count): the quick sweep
    counts a small case of it instead; ops whose first traffic case is small keep it."""
    import torch

    for name in ("linear_cross_entropy", "softmax"):
        spec = REGISTRY[name]
        (case,) = quick_traffic_cases(spec)
        assert spec.min_bytes(case, torch.bfloat16, "fwd") <= QUICK_TRAFFIC_MAX_BYTES
    assert quick_traffic_cases(REGISTRY["softmax"])[0].name == REGISTRY["softmax"].bench_cases[0].name


def test_interrupted_run_stays_marked_incomplete(tmp_path):
    """A run interrupted mid-way (here by the progress callback) keeps status "incomplete" in the store; a run
    that finishes is "complete"."""
    store = tmp_path / "s.sqlite"
    req = job.BenchRequest(op=("softmax",), dtype=("fp32",), device="cpu", store=str(store), report=None,
                           inspect_targets=(), traffic=False)
    done = job.run(req)
    assert done.as_dict()["run"]["info"]["extra"]["status"] == "complete" and done.exit_code == 0

    def interrupt(i, n, what):
        if i == n:  # after the last check, before the run is marked complete
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        job.run(req, lambda phase: interrupt)
    with ResultStore(store) as st:
        assert [r.extra["status"] for r in st.runs()] == ["complete", "incomplete"]
        assert list(st.statuses().values()) == ["complete", "incomplete"], "the store's own run status"


def test_static_documents_are_kept_with_the_run(tmp_path):
    """The CPU job's traffic document goes into the store with its run, so `wavefront report` without
    arguments still has the section."""
    store = tmp_path / "s.sqlite"
    req = job.BenchRequest(op=("softmax",), dtype=("fp32",), device="cpu", store=str(store),
                           report=str(tmp_path / "r.html"), inspect_targets=(), traffic=True)
    done = job.run(req)
    with ResultStore(store) as st:
        kept = st.documents(done.run_id)
    assert set(kept) == {"traffic"}
    assert {r["op"] for r in kept["traffic"][1]["rows"]} == {"softmax"}


def test_compare_explains_runs_without_timings(tmp_path):
    """`compare 1 1` on a CPU bench run (correctness only) says why there is nothing to compare."""
    info = RunInfo("2026-01-01T00:00:00Z", "", None, None, "cpu", "cpu", "cpu-interpreter", "", "", "", "", "none")
    with ResultStore(tmp_path / "s.sqlite") as st:
        st.save(StoredRun(info))
    result = compare.run(compare.CompareRequest("1", "1", store=str(tmp_path / "s.sqlite")))
    assert not result.deltas and any("runs A and B hold no timings" in n for n in result.notes)
    assert json.loads(json.dumps(result.as_dict()))["schema"] == compare.SCHEMA


def test_gate_baseline_policy(tmp_path):
    static = tmp_path / "static.json"
    static.write_text(json.dumps({"schema": "wavefront.gate.static-baseline/1"}))
    perf = tmp_path / "results.json"
    perf.write_text("{}")
    assert split_baselines(GateRequest(baseline=(str(static), str(perf)))) == (static, str(perf))
    new = tmp_path / "new.json"
    assert split_baselines(GateRequest(static=True, baseline=(str(new),))) == (new, None)
    with pytest.raises(RequestError):
        split_baselines(GateRequest())


@pytest.mark.no_memcheck
@pytest.mark.parametrize("memcheck", [False, True])
def test_memcheck_request_checks_the_correctness_phase(monkeypatch, memcheck):
    """BenchRequest(memcheck=True) (`wavefront bench --memcheck`) runs every correctness case under memcheck,
    and only then."""
    from wavefront import memcheck as mc

    seen, real = [], job.check_case

    def spy(*args, **kwargs):
        seen.append(mc.enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(job, "check_case", spy)
    req = job.BenchRequest(op=("softmax",), dtype=("fp32",), device="cpu", store=None, report=None,
                           inspect_targets=(), traffic=False, memcheck=memcheck)
    done = job.run(req)
    assert done.exit_code == 0 and seen and set(seen) == {memcheck} and not mc.enabled()


def test_a_bad_memcheck_environment_variable_is_a_request_error(monkeypatch):
    monkeypatch.setenv("WAVEFRONT_MEMCHECK", "yes")
    with pytest.raises(RequestError) as info:
        job.plan(job.BenchRequest(device="cpu", op=("softmax",)))
    assert info.value.argument == "memcheck" and "WAVEFRONT_MEMCHECK='yes': expected 0, 1 or init" in str(info.value)
