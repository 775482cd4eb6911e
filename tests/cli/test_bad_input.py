"""Bad input to every bench-family verb: exit 2, one line on stderr naming the option, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wavefront.workbench.bench.records import RunInfo, StoredRun
from wavefront.workbench.bench.store import ResultStore

ROOT = Path(__file__).resolve().parents[2]
STATIC = str(ROOT / "benchmarks" / "baselines" / "static.json")


def invoke(*args, cwd, monkeypatch):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(cwd)
    return CliRunner().invoke(build_app(), [str(a) for a in args])


def _files(tmp: Path) -> None:
    (tmp / "adir").mkdir()
    (tmp / "norows.json").write_text(json.dumps({"schema": "wavefront.inspect/1"}))
    (tmp / "rows_not_list.json").write_text(json.dumps({"schema": "wavefront.traffic/1", "rows": {"a": 1}}))
    (tmp / "inspect_doc.json").write_text(json.dumps({"schema": "wavefront.inspect/1", "rows": []}))
    (tmp / "garbage.json").write_text("{not json")
    (tmp / "number.json").write_text("3")


CASES = [
    (("bench", "--store", "adir"), "--store: 'adir' is a directory"),
    (("bench", "--report", "adir"), "--report: 'adir' is a directory"),
    (("bench", "--doc", "absent.json"), "--doc: no such file: absent.json"),
    (("bench", "--case", "no_such_case"), "--case: no case named 'no_such_case'"),
    (("bench", "--mode", "up"), "'up' is not one of 'fwd', 'bwd', 'fwd_bwd'"),
    (("bench", "--reps", "0"), "--reps"),
    (("bench", "--inspect-targets", "sm_75"), "--inspect-targets: unknown target 'sm_75'"),
    (("gate", "--static", "--baseline", STATIC, "--inspect", "norows.json"), "--inspect: norows.json has no 'rows'"),
    (("gate", "--static", "--baseline", STATIC, "--inspect", "inspect_doc.json", "--traffic", "rows_not_list.json"),
     "--traffic: rows_not_list.json has 'rows' that is not a list"),
    (("gate", "--baseline", "garbage.json"), "--baseline: cannot read garbage.json"),
    (("gate", "--baseline", "absent.sqlite"), "--baseline: no such file: absent.sqlite"),
    (("gate", "--threshold", "-1", "--static"), "--threshold"),
    (("roofline", "--traffic", "inspect_doc.json"), "--traffic: inspect_doc.json has schema 'wavefront.inspect/1'"),
    (("roofline", "--store", "adir"), "--store: adir is a directory"),
    (("roofline", "--measured", "number.json"), "--measured: cannot read number.json"),
    (("inspect", "--targets", "sm_75"), "--targets: unknown target 'sm_75'"),
    (("inspect", "--workers", "0"), "--workers"),
    (("traffic", "--dtype", "fp8"), "'fp8' is not one of 'fp32', 'bf16', 'fp16'"),
    (("traffic", "--op", "nope"), "--op: unknown op 'nope'"),
    (("compare", "1", "2", "--store", "adir"), "cannot read the runs"),
    (("compare", "--calibrate", "--trials", "0"), "--trials"),
    (("bisect", "--good", "a"), "Missing option '--bad'"),
    (("bisect", "--good", "a", "--bad", "b", "--op", "softmax", "--threshold", "-0.5"), "--threshold"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a[:2]) + f"-{i}" for i, (a, _) in
                                                          enumerate(CASES)])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, message):
    _files(tmp_path)
    r = invoke(*args, cwd=tmp_path, monkeypatch=monkeypatch)
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert message in lines[0] and "Traceback" not in r.output


def _store_with_runs(path: Path, statuses) -> None:
    with ResultStore(path) as st:
        for status in statuses:
            info = RunInfo("2026-01-01T00:00:00Z", "", None, None, "cpu", "cpu", "cpu-interpreter", "", "", "", "",
                           "cpu-interpreter", extra={"status": status} if status else {})
            st.save(StoredRun(info))


def test_gate_refuses_an_interrupted_run(tmp_path, monkeypatch):
    """An interrupted bench leaves its run marked incomplete: the gate says so (exit 2) instead of counting its
    missing cases as regressions (exit 1). A run stored before runs were marked counts as complete."""
    _store_with_runs(tmp_path / "s.sqlite", [None, "complete", "incomplete"])
    r = invoke("gate", "--baseline", "s.sqlite:1", "--store", "s.sqlite", "--current", "3", cwd=tmp_path,
               monkeypatch=monkeypatch)
    assert r.exit_code == 2 and "run 3 is incomplete" in r.stderr, r.output
    ok = invoke("gate", "--baseline", "s.sqlite:1", "--store", "s.sqlite", "--current", "2", cwd=tmp_path,
                monkeypatch=monkeypatch)
    assert ok.exit_code == 0, ok.output


# typer/click's own errors, one of each kind on several verbs: a number out of range, a bad choice, an unknown
# command, a missing argument or option value
TYPER_CASES = [
    (("plan", "--top", "-1"), "--top"),
    (("plan", "--precision", "fp4"), "--precision: 'fp4' is not one of"),
    (("comm", "--iters", "0"), "--iters"),
    (("comm", "--mode", "sideways"), "--mode: 'sideways' is not one of"),
    (("overlap", "--steps", "0"), "--steps"),
    (("overlap", "--backend", "mpi"), "--backend: 'mpi' is not one of"),
    (("train", "--steps", "0"), "--steps"),
    (("train", "--parallel", "zero"), "--parallel: 'zero' is not one of"),
    (("trace", "analyze", "x.json", "--top", "0"), "--top"),
    (("trace", "analyze", "x.json", "--align", "up"), "--align: 'up' is not one of 'auto', 'ends', 'none'"),
    (("trace", "diff", "a", "b", "--alpha", "2"), "--alpha"),
    (("trace", "analyze"), "Missing argument 'traces'"),
    (("trace", "diff", "a"), "Missing argument 'b'"),
    (("trace", "frobnicate"), "No such command 'frobnicate'"),
    (("frobnicate",), "No such command 'frobnicate'"),
    (("report", "--title"), "--title"),
    (("inspect", "--workers", "x"), "--workers"),
]


def _one_line(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Usage:" not in r.output and "╭" not in r.output and "Traceback" not in r.output, r.output
    return lines[0]


@pytest.mark.parametrize(("args", "message"), TYPER_CASES, ids=[" ".join(a) for a, _ in TYPER_CASES])
def test_typer_errors_are_one_line(tmp_path, monkeypatch, args, message):
    assert message in _one_line(invoke(*args, cwd=tmp_path, monkeypatch=monkeypatch))


# Output paths: every file a verb writes is checked before the job runs: a path into a missing directory, a
# directory, a path through a file is one line naming the option (exit 2), the directory is not created and
# nothing runs; a results store to read is never made out of an empty file.
# each verb with the arguments it needs to get as far as its options
JSON_VERBS = [("bench",), ("compare",), ("report",), ("bisect", "--good", "a", "--bad", "b"), ("comm",), ("overlap",),
              ("plan",), ("train",), ("inspect",), ("traffic",), ("roofline",), ("gate",),
              ("trace", "analyze", "t.json"), ("trace", "diff", "a.json", "b.json"), ("counters", "p.csv")]
OTHER_OUTPUTS = [("bench", "--store"), ("bench", "--report"), ("train", "--store"), ("report", "--out"),
                 ("report", "--export-json"), ("report", "--export-csv"), ("trace", "analyze", "t.json", "--figures"),
                 ("trace", "analyze", "t.json", "--annotate"), ("gate", "--markdown"), ("comm", "--calibration")]


@pytest.mark.parametrize("args", JSON_VERBS + OTHER_OUTPUTS, ids=lambda a: " ".join(a))
def test_missing_directory_is_one_line_before_any_work(tmp_path, monkeypatch, args):
    if args[-1].startswith("--"):
        option, args = args[-1], args[:-1]
    else:
        option = "--json"
    line = _one_line(invoke(*args, option, "missing/out.file", cwd=tmp_path, monkeypatch=monkeypatch))
    assert f"{option}: cannot write 'missing/out.file': the directory 'missing' does not exist" in line
    assert not (tmp_path / "missing").exists()
    assert not (tmp_path / "wavefront-results.sqlite").exists(), "nothing ran"


@pytest.mark.parametrize(("target", "message"), [("adir", "'adir' is a directory; give a file name"),
                                                 ("afile/out.json", "a file is in the path ('afile')")])
def test_plan_json_into_a_directory_or_through_a_file(tmp_path, monkeypatch, target, message):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    line = _one_line(invoke("plan", "--model", "llama3-8b", "--json", target, cwd=tmp_path, monkeypatch=monkeypatch))
    assert f"--json: {message}" in line or f"--json: cannot write {target!r}: {message}" in line


def test_plan_json_to_an_unwritable_path(tmp_path, monkeypatch):
    line = _one_line(invoke("plan", "--model", "llama3-8b", "--json", "/proc/wavefront-plan.json", cwd=tmp_path,
                            monkeypatch=monkeypatch))
    assert "--json: cannot write '/proc/wavefront-plan.json'" in line


def test_plan_json_into_an_existing_directory_works(tmp_path, monkeypatch):
    (tmp_path / "out").mkdir()
    r = invoke("plan", "--model", "llama3-8b", "--gpus", "8xh100", "--top", "1", "--json", "out/plan.json",
               cwd=tmp_path, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "plan.json").stat().st_size > 0


def test_report_refuses_an_empty_file_as_store(tmp_path, monkeypatch):
    (tmp_path / "empty.sqlite").write_bytes(b"")
    line = _one_line(invoke("report", "--store", "empty.sqlite", "--out", "r.html", cwd=tmp_path,
                            monkeypatch=monkeypatch))
    assert "--store: empty.sqlite is an empty file, not a wavefront results store" in line
    assert (tmp_path / "empty.sqlite").stat().st_size == 0 and not (tmp_path / "r.html").exists()
