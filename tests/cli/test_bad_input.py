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
