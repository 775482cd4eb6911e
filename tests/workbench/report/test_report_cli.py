"""`wavefront report` on the command line: bad input is exit 2 with one line, stored documents come back."""

from __future__ import annotations

import json

import pytest
from _report_docs import inspect_document, traffic_document

from wavefront.workbench.bench.store import ResultStore


def _report(*args, cwd, monkeypatch):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(cwd)
    return CliRunner().invoke(build_app(), ["report", *args])


def _one_line_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    text = " ".join(result.stderr.split())  # rich may wrap at the terminal width
    assert message in text, text
    assert "Traceback" not in result.output and text.startswith("error:") and text.count("error:") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "--store: no results store at wavefront-results.sqlite (run `wavefront bench` first, or pass --no-store)"),
        (("--store", "."), "--store: . is a directory: give the path of a results store file"),
        (("--no-store", "--export-csv", "x.csv"), "--export-json/--export-csv need a store"),
        (("--no-store", "--device", "tpu"), "--device: unknown GPU 'tpu'"),
    ],
)
def test_bad_store_arguments(tmp_path, monkeypatch, args, message):
    _one_line_error(_report(*args, cwd=tmp_path, monkeypatch=monkeypatch), message)
    assert not (tmp_path / "artifacts").exists()  # no page written on bad input


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"schema": "wavefront.results/1", "runs": []}, "schema 'wavefront.results/1': not a document the dashboard"),
        ({"rows": []}, 'no "schema" field'),
        ({"schema": "wavefront.inspect/1", "rows": 3}, "wavefront.inspect/1 document without a list of row objects"),
    ],
)
def test_wrong_document_is_exit_2(tmp_path, monkeypatch, content, message):
    (tmp_path / "doc.json").write_text(json.dumps(content))
    _one_line_error(
        _report("--no-store", "--doc", "doc.json", cwd=tmp_path, monkeypatch=monkeypatch), f"--doc doc.json: {message}"
    )


def test_report_without_arguments_keeps_what_bench_stored(tmp_path, monkeypatch, store_path):
    with ResultStore(store_path) as st:
        st.add_document(3, "inspect", inspect_document())
        st.add_document(3, "traffic", traffic_document())
    r = _report("--store", str(store_path), "--results-dir", "", "--json", "-", cwd=tmp_path, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "wavefront.report/1" and doc["n_runs"] == 4 and doc["n_left_out"] == 1
    assert doc["documents"] == ["inspect (stored with run 3)", "traffic (stored with run 3)"]
    html = (tmp_path / doc["report"]).read_text()
    assert "inspect: occupancy per kernel and target" in html


def test_no_store_draws_the_modeled_charts_and_documents(tmp_path, monkeypatch):
    (tmp_path / "traffic.json").write_text(json.dumps(traffic_document()))
    r = _report(
        "--no-store", "--doc", "traffic.json", "--device", "h100", "--json", "-", cwd=tmp_path, monkeypatch=monkeypatch
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["store"] is None and doc["devices"] == ["h100"] and doc["documents"][0] == "traffic.json"
