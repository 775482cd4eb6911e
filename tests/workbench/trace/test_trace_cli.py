"""The `wavefront trace` verbs: JSON documents, figures, and one-line errors for bad input."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.trace import analyze
from wavefront.workbench.trace.testing import planted_gpu_trace

runner = CliRunner()


def _run(*args):
    return runner.invoke(build_app(), ["trace", *map(str, args)])


def test_analyze_json_and_figures(tmp_path):
    p = planted_gpu_trace().write(tmp_path / "p.json.gz")
    res = _run("analyze", p, "--json", "-", "--figures", tmp_path / "fig.json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "wavefront.trace.analyze/2"
    step = doc["ranks"][0]["steps"][0]
    parts = ["compute_us", "comm_overlapped_us", "comm_exposed_us", "memory_us", "idle_host_bound_us",
             "idle_other_us"]
    assert sum(step[k] for k in parts) == step["dur_us"] == 1000.0
    assert doc["ranks"][0]["kernels"]["gpu"] == "h100" and doc["ranks"][0]["launch"]["delay_us"]["n"] == 10
    figs = json.loads((tmp_path / "fig.json").read_text())
    assert figs["schema"] == "wavefront.trace.figures/1"
    assert [f["title"].split(" on ")[0] for f in figs["figures"]] == ["Step time breakdown", "Kernel roofline"]


def test_analyze_tables_and_directory(tmp_path, data_dir):
    res = _run("analyze", data_dir / "gloo_rank0.json.gz", data_dir / "gloo_rank1.json.gz", "--top", "3")
    assert res.exit_code == 0, res.output
    assert "step breakdown" in res.output and "multi-rank" in res.output and "CPU-only" in res.output
    d = tmp_path / "set"
    d.mkdir()
    planted_gpu_trace().write(d / "r0.json")
    res = _run("analyze", d, "--json", "-")
    assert res.exit_code == 0 and len(json.loads(res.stdout)["ranks"]) == 1


def test_diff_json(data_dir):
    res = _run("diff", data_dir / "cpu_train_h64.json.gz", data_dir / "cpu_train_h512.json.gz", "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "wavefront.trace.diff/1" and doc["n_steps_a"] == 20
    assert {r["verdict"] for r in doc["rows"]} <= {"faster", "slower", "same", "unknown"}


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such trace file"),
    ("not json at all", "not a JSON trace"),
    ('{"schemaVersion": 1}', "no 'traceEvents' list"),
])
def test_bad_input_is_one_line(tmp_path, content, message):
    p = tmp_path / "bad.json"
    if content is not None:
        p.write_text(content)
    res = _run("analyze", p)
    text = " ".join(res.output.split())  # rich wraps long lines at the terminal width
    assert res.exit_code == 2 and text.startswith("error:")
    assert message in text and "Traceback" not in text and "no trace could be read" not in text


def test_bad_options(tmp_path):
    p = planted_gpu_trace().write(tmp_path / "p.json")
    for args, message in ((["--align", "sideways"], "'sideways' is not one of"),
                          (["--top", "0"], "greater than or equal to 1")):
        res = _run("analyze", p, *args)
        assert res.exit_code == 2 and message in " ".join(res.output.replace("│", " ").split())
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no" in " ".join(_run("analyze", empty).output.split())


def test_truncated_trace_gives_partial_results(tmp_path):
    text = json.dumps(planted_gpu_trace().to_dict())
    p = tmp_path / "cut.json"
    p.write_text(text[: text.index('"triton_poi_fused_gelu_2"')])
    res = _run("analyze", p, "--json", "-")
    assert res.exit_code == 0
    rank = json.loads(res.stdout)["ranks"][0]
    assert rank["complete"] is False and any("truncated" in w for w in rank["warnings"])
    assert [s["step"] for s in rank["steps"]] == [1, 2]


def test_one_unreadable_rank_is_skipped(tmp_path):
    good = planted_gpu_trace().write(tmp_path / "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text("garbage")
    res = _run("analyze", good, bad, "--json", "-")
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert len(doc["ranks"]) == 1 and any("skipped" in w and "bad.json" in w for w in doc["warnings"])


def test_annotated_copy_opens_and_keeps_every_event(tmp_path):
    from wavefront.workbench.trace import load_trace
    from wavefront.workbench.trace.breakdown import step_breakdowns

    src = planted_gpu_trace().write(tmp_path / "p.json", indent=2)
    out = tmp_path / "annotated.json.gz"
    res = _run("analyze", src, "--annotate", out, "--json", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    original, annotated = load_trace(src), load_trace(out)
    assert annotated.complete and annotated.n_events > original.n_events
    assert step_breakdowns(annotated)[0] == step_breakdowns(original)[0]  # the analysis tracks change nothing
    with gzip.open(out, "rt") as f:
        doc = json.load(f)
    added = [e for e in doc["traceEvents"] if e.get("pid") == "wavefront analysis" and e["ph"] == "X"]
    by_track = {}
    for e in added:
        by_track[e["tid"]] = by_track.get(e["tid"], 0.0) + e["dur"]
    assert by_track == {"steps": 2000.0, "comm exposed": 400.0, "comm hidden by compute": 150.0,
                        "idle: host-bound": 300.0, "idle: other": 360.0}
    assert doc["deviceProperties"][0]["name"] == "NVIDIA H100 80GB HBM3"
    two = _run("analyze", src, src, "--annotate", out)
    assert two.exit_code == 2 and "exactly one" in two.output


# The CLI in a fresh interpreter where importing torch or triton fails: `wavefront trace` needs neither.
NO_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
from wavefront.cli.trace import app
app(sys.argv[1:], prog_name="wavefront trace")
"""


def _cli(*args, columns: int = 100):
    env = dict(os.environ, COLUMNS=str(columns), PYTHONPATH=str(Path(__file__).resolve().parents[3] / "src"))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", NO_TORCH, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=120)


def test_analyze_without_torch(tmp_path):
    p = planted_gpu_trace().write(tmp_path / "p.json")
    ok = _cli("analyze", p, "--json", "-")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ranks"][0]["totals"]["step_us"] == 2000.0
    (tmp_path / "numbers.json").write_text("[1,2,3]")
    bad = _cli("analyze", tmp_path / "numbers.json")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "holds no usable event" in bad.stderr


@pytest.mark.parametrize(("content", "message"), [
    (None, "ends early (truncated)"),  # cut before the first event
    ("[1,2,3]", "holds no usable event (3 malformed)"),
    ('{"traceEvents": []}', "holds no events"),
])
def test_files_without_events_are_one_line_errors(tmp_path, content, message):
    text = planted_gpu_trace().text()
    p = tmp_path / "bad.json"
    p.write_text(content if content is not None else text[: text.index('"traceEvents"') + 40])
    res = _run("analyze", p)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error:") and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert message in res.stderr and "bad.json" in res.stderr


@pytest.mark.parametrize("columns", [80, 120])
def test_tables_never_cut_a_number(tmp_path, data_dir, monkeypatch, columns):
    from rich.console import Console

    import wavefront.cli.trace as cli_trace

    p = planted_gpu_trace().write(tmp_path / "p.json")
    for args in ([p], [data_dir / "gloo_rank0.json.gz", data_dir / "gloo_rank1.json.gz"]):
        out = io.StringIO()
        monkeypatch.setattr(cli_trace, "console", Console(file=out, width=columns, color_system=None))
        res = _run("analyze", *args, "--top", "5")
        assert res.exit_code == 0, res.output
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= columns
        assert not any(re.search(r"(^|\s)[-\d.,%]+…", line) for line in lines)  # no number cut short
        for rank in analyze(args).ranks:
            for step in rank.steps:  # every step time is printed whole
                assert f"{step.dur_us / 1e3:,.3f}" in out.getvalue()


def test_single_trace_heading_and_cpu_op_table_once(data_dir):
    res = _run("analyze", data_dir / "cpu_train_h64.json.gz", "--top", "3")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "rank ?" not in text and "trace cpu_train_h64.json.gz" in text
    assert text.count("CPU operator families by total time") == 1
    assert text.count("top-level CPU operators by total time") <= 1


def test_hta_compatible(tmp_path):
    from wavefront.workbench.trace import load_trace
    from wavefront.workbench.trace.compat import hta_equivalent

    p = planted_gpu_trace().write(tmp_path / "p.json")
    res = _run("analyze", p, "--hta-compatible", "--json", "-")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["ranks"][0]["hta_equivalent"]
    assert got == hta_equivalent(load_trace(p))
    assert got["kernel_time_us"] > 0
    table = _run("analyze", p, "--hta-compatible")
    assert "HTA 0.5.0 definitions" in table.output


def test_long_step_tables_show_first_and_last_steps():
    """Past MAX_STEP_ROWS steps the terminal table shows the first and the last halves and says how many
    it left out (every step stays in --json)."""
    from wavefront.workbench.trace.report import MAX_STEP_ROWS, Column, Table, _step_rows

    t = Table("steps", [Column("step", numeric=False), Column("ms")])
    _step_rows(t, list(range(1000)), lambda s: [str(s), "1.000"])
    half = MAX_STEP_ROWS // 2
    assert [r[0] for r in t.rows[:half]] == [str(i) for i in range(half)]
    assert t.rows[half] == [f"({1000 - 2 * half:,} more)", "…"]
    assert [r[0] for r in t.rows[half + 1:]] == [str(i) for i in range(1000 - half, 1000)]
    short = Table("steps", [Column("step", numeric=False)])
    _step_rows(short, list(range(MAX_STEP_ROWS)), lambda s: [str(s)])
    assert len(short.rows) == MAX_STEP_ROWS
