"""The smoke check on the CPU interpreter: real op checks, a planted wrong op, a planted hang and a planted
crash, each named in seconds, with the results file kept line by line across the worker restarts."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case
from wavefront.workbench.bench import smoke

TINY = Case("tiny", "smoke test", {"n_rows": 3, "n_cols": 40})

# A worker whose registry holds planted ops beside a real one (all on the CPU interpreter): `bad` returns
# wrong numbers, `hang` never returns, `crash` kills its own process as a faulting kernel would.
_WORKER = textwrap.dedent("""
    import os, signal, sys, time
    from dataclasses import replace
    from pathlib import Path
    from wavefront.ops import REGISTRY
    from wavefront.ops._spec import Case
    from wavefront.workbench.bench import smoke

    tiny = Case("tiny", "smoke test", {"n_rows": 3, "n_cols": 40})
    softmax = replace(REGISTRY["softmax"], cases=(tiny,))

    def hang(*args, **kwargs):
        time.sleep(3600)

    def crash(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGSEGV)

    specs = {"softmax": softmax, "softmax_again": replace(softmax, name="softmax_again"),
             "bad": replace(softmax, name="bad", fn=lambda x, **kw: softmax.fn(x, **kw) * 1.5),
             "hang": replace(softmax, name="hang", fn=hang), "crash": replace(softmax, name="crash", fn=crash)}
    path, device, timeout_s, *ops = sys.argv[1:]
    smoke.run_worker(Path(path), ops, device, float(timeout_s), specs=specs)
""")


def test_smoke_case_and_dtype_are_the_registry_plain_case():
    for spec in REGISTRY.values():
        case = smoke.smoke_case(spec)
        assert not case.slow and case is next(c for c in spec.cases if not c.slow)
        assert smoke.smoke_dtype(spec) in spec.dtypes
    assert smoke.smoke_dtype(REGISTRY["softmax"]).is_floating_point


def test_a_real_op_passes_and_a_wrong_one_fails_in_process(tmp_path):
    softmax = replace(REGISTRY["softmax"], cases=(TINY,))
    wrong = replace(softmax, name="wrong", fn=lambda x, **kw: softmax.fn(x, **kw) + 1e-2)
    specs = {"softmax": softmax, "wrong": wrong}
    path = tmp_path / "smoke.jsonl"
    smoke.run_worker(path, ["softmax", "wrong"], "cpu", 60.0, specs=specs)
    done = smoke.final_status(smoke.read_records(path))
    assert done["softmax"]["status"] == "pass" and done["softmax"]["modes"] == ["bwd", "fwd"]
    assert done["wrong"]["status"] == "fail" and "out0 (fwd)" in done["wrong"]["detail"]
    # A second worker over the same file runs nothing again.
    before = path.read_text()
    smoke.run_worker(path, ["softmax", "wrong"], "cpu", 60.0, specs=specs)
    assert path.read_text() == before


# A worker with planted checks and no torch import (it starts in a fraction of a second): `slow_*` sleeps
# past any limit, `bad` fails, `crash` dies of a segmentation fault as a faulting kernel's process would.
_FAKE_WORKER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from wavefront.workbench.bench import smoke

    def check(name, device):
        if name.startswith("slow"):
            time.sleep(3600)
        if name == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if name.startswith("fault"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"op": name, "status": "fail" if name == "bad" else "pass", "wall_s": 0.01}

    path, device, timeout_s, *ops = sys.argv[1:]
    smoke.run_worker(Path(path), ops, device, float(timeout_s), specs={o: o for o in ops}, check=check)
""")


def _command(tmp_path: Path, script: str, timeout_override: str | None = None):
    worker = tmp_path / "worker.py"
    worker.write_text(script)

    def command(path, ops, device, timeout_s):
        return [sys.executable, str(worker), str(path), device, timeout_override or str(timeout_s), *ops]

    return command


def test_hang_and_crash_are_named_and_the_run_goes_on(tmp_path):
    path = tmp_path / "smoke.jsonl"
    ops = ["a", "bad", "slow_hang", "crash", "b"]
    t0 = time.monotonic()
    summary = smoke.run_smoke(path, ops, device="cpu", timeout_s=1.0, budget_s=60.0,
                              command=_command(tmp_path, _FAKE_WORKER))
    wall = time.monotonic() - t0
    status = {r["op"]: r["status"] for r in summary.records}
    assert status == {"a": "pass", "bad": "fail", "slow_hang": "timeout", "crash": "crashed", "b": "pass"}
    assert summary.workers == 3  # restarted after the hang and after the crash, skipping what was done
    assert not summary.ok and summary.count("pass") == 2
    hang = next(r for r in summary.records if r["op"] == "slow_hang")
    assert hang["wall_s"] == 1.0 and "ended" in hang["detail"]
    assert "exit code -11" in next(r for r in summary.records if r["op"] == "crash")["detail"]
    assert wall < 30  # one 1 s limit and three light start-ups
    # The file holds every step as it happened: each op started once, then its one final line.
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["op"] for r in lines if r["status"] == "started"] == ops
    assert len([r for r in lines if r["status"] != "started"]) == len(ops)
    table = summary.table()
    assert "slow_hang" in table and "timeout" in table and "2 pass" in table


def test_on_a_device_an_error_ends_the_worker_and_the_next_op_gets_a_fresh_one(tmp_path):
    path = tmp_path / "smoke.jsonl"
    summary = smoke.run_smoke(path, ["a", "fault", "b"], device="cuda", timeout_s=5.0, budget_s=60.0,
                              command=_command(tmp_path, _FAKE_WORKER))
    assert [r["status"] for r in summary.records] == ["pass", "error", "pass"] and summary.workers == 2
    assert "illegal memory access" in summary.records[1]["detail"]
    cpu = smoke.run_smoke(tmp_path / "cpu.jsonl", ["a", "fault", "b"], device="cpu", timeout_s=5.0, budget_s=60.0,
                          command=_command(tmp_path, _FAKE_WORKER))
    assert [r["status"] for r in cpu.records] == ["pass", "error", "pass"] and cpu.workers == 1


def test_parallel_workers_share_the_file(tmp_path):
    path = tmp_path / "smoke.jsonl"
    ops = ["a", "b", "slow_1", "c", "d", "e"]
    summary = smoke.run_smoke(path, ops, device="cpu", timeout_s=1.0, budget_s=60.0, jobs=3,
                              command=_command(tmp_path, _FAKE_WORKER))
    assert [r["status"] for r in summary.records] == ["pass", "pass", "timeout", "pass", "pass", "pass"]


def test_partial_results_survive_a_killed_worker(tmp_path):
    """The budget's backstop: a worker whose own limit is far past the budget is killed while on its op;
    the op is named (a timeout: it ran past the per-op limit), the ops after it are `not-run`, and the lines
    written before stay."""
    path = tmp_path / "smoke.jsonl"
    summary = smoke.run_smoke(path, ["a", "slow_hang", "b"], device="cpu", timeout_s=1.0, budget_s=4.0,
                              command=_command(tmp_path, _FAKE_WORKER, timeout_override="600"))
    status = {r["op"]: r["status"] for r in summary.records}
    assert status == {"a": "pass", "slow_hang": "timeout", "b": "not-run"}
    assert "exit code -9" in summary.records[1]["detail"]


@pytest.mark.slow
def test_real_ops_and_a_planted_hang_under_the_interpreter(tmp_path):
    """The same on interpreted kernels (each worker imports torch and warms the interpreter: ~10 s each on
    a loaded 2-core machine)."""
    path = tmp_path / "smoke.jsonl"
    env = os.environ.copy()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        summary = smoke.run_smoke(path, ["softmax", "bad", "hang", "softmax_again"], device="cpu", timeout_s=60.0,
                                  budget_s=400.0, command=_command(tmp_path, _WORKER))
    finally:
        os.environ.clear()
        os.environ.update(env)
    assert [r["status"] for r in summary.records] == ["pass", "fail", "timeout", "pass"]


def test_a_worker_that_cannot_start_is_reported_once(tmp_path):
    path = tmp_path / "smoke.jsonl"
    t0 = time.monotonic()
    summary = smoke.run_smoke(path, ["a", "b"], device="cpu", timeout_s=1.0, budget_s=60.0,
                              command=_command(tmp_path, "raise SystemExit(7)"))
    assert time.monotonic() - t0 < 20 and summary.workers == 1
    assert [r["status"] for r in summary.records] == ["error", "error"]
    assert "[7]" in summary.records[0]["detail"]


def test_a_line_cut_short_is_skipped(tmp_path):
    path = tmp_path / "smoke.jsonl"
    path.write_text(json.dumps({"op": "a", "status": "pass"}) + "\n" + '{"op": "b", "sta')
    assert smoke.final_status(smoke.read_records(path)) == {"a": {"op": "a", "status": "pass"}}


@pytest.mark.parametrize("argv", [["nope", "--results", "x"], ["--results", "x", "--jobs", "0"]])
def test_bad_arguments_are_one_line_and_exit_2(argv, capsys, tmp_path):
    assert smoke.main([*argv[:-1], str(tmp_path / argv[-1])] if argv[-1] == "x" else argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("smoke: ") and err.count("\n") == 1


def test_summary_document(tmp_path):
    path = tmp_path / "smoke.jsonl"
    path.write_text(json.dumps({"op": "a", "status": "pass", "wall_s": 0.5}) + "\n")
    doc = smoke.summarize(path, ["a", "b"], wall_s=1.0, workers=1).as_dict()
    assert doc["counts"] == {"pass": 1, "not-run": 1} and not doc["ok"]
    assert Path(path).read_text().count("\n") == 1
