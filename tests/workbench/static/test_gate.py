"""The static gate: each rule on synthetic rows, planted regressions in real compiled kernels, the CLI."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.kernels._launch import TensorArg
from wavefront.workbench.static import gate as g
from wavefront.workbench.static.inspect import inspect_ops

GOOD = {"ok": True, "error": None, "num_warps": 8, "regs": 60, "sgprs": None, "agprs": None, "spill_bytes": 0,
        "spill_count": 0, "shared_bytes": 1024, "widest_load_bits": 128, "widest_store_bits": 128, "narrow_loads": 1,
        "narrow_stores": 0, "occupancy": 0.5, "matrix_families": ["wgmma"], "tma_ops": 4, "setmaxnreg": 2,
        "mma_wait_depth": 1, "min_mma_n": 64, "loop_barriers": 1, "narrow_lds_ops": 0}
KEY = "op/fwd/case/k@sm_90"


@pytest.mark.parametrize(("change", "rule"), [
    ({"ok": False, "error": "CompilationError: boom"}, "compile"),
    ({"spill_bytes": 64, "spill_count": 3}, "spills"),
    ({"widest_load_bits": 64}, "load-width"),
    ({"widest_store_bits": 32}, "store-width"),
    ({"narrow_loads": 9}, "load-width"),
    ({"regs": 67}, "registers"),
    ({"occupancy": 0.25}, "occupancy"),
    ({"matrix_families": []}, "matrix"),
    ({"tma_ops": 0}, "tma"),
    ({"setmaxnreg": 0}, "setmaxnreg"),
    ({"mma_wait_depth": 0}, "mma-wait"),
    ({"mma_wait_depth": None}, "mma-wait"),
    ({"min_mma_n": 16}, "mma-n"),
    ({"loop_barriers": 3}, "loop-barriers"),
    ({"narrow_lds_ops": 40}, "narrow-lds"),
])
def test_each_rule_fires(change, rule):
    findings, _ = g.compare_inspect({KEY: GOOD}, {KEY: GOOD | change})
    assert [f.rule for f in findings] == [rule]
    assert findings[0].line().startswith(KEY + ": ")


def test_no_finding_within_limits_or_for_improvements():
    better = GOOD | {"regs": 66, "occupancy": 0.75, "spill_bytes": 0, "narrow_loads": 0}  # +10% registers is allowed
    findings, notes = g.compare_inspect({KEY: GOOD}, {KEY: better, "new/fwd/c/k@gfx942": GOOD})
    assert findings == []
    assert "1 kernel x target rows not in the baseline" in notes[0]


def test_baseline_rows_without_the_design_fields_are_tolerated():
    """A baseline written before the design fields existed compares only what it has."""
    old = {k: v for k, v in GOOD.items() if k not in ("tma_ops", "setmaxnreg", "mma_wait_depth", "min_mma_n",
                                                     "loop_barriers", "narrow_lds_ops")}
    worse = GOOD | {"tma_ops": 0, "mma_wait_depth": 0, "min_mma_n": 8, "loop_barriers": 9, "narrow_lds_ops": 9}
    assert g.compare_inspect({KEY: old}, {KEY: worse})[0] == []
    better = GOOD | {"tma_ops": 8, "mma_wait_depth": 2, "min_mma_n": 128, "loop_barriers": 0}
    assert g.compare_inspect({KEY: GOOD}, {KEY: better})[0] == []
    none = GOOD | {"mma_wait_depth": None, "min_mma_n": None, "loop_barriers": None}  # not applicable
    assert g.compare_inspect({KEY: none}, {KEY: GOOD})[0] == []


def test_accesses_moved_to_tma_are_not_lost_vectorization():
    moved = GOOD | {"widest_load_bits": 0, "widest_store_bits": 32, "tma_ops": 9}
    findings, notes = g.compare_inspect({KEY: GOOD}, {KEY: moved})
    assert findings == [] and any("with TMA operations 4 -> 9" in n for n in notes)
    assert [f.rule for f in g.compare_inspect({KEY: GOOD}, {KEY: moved | {"tma_ops": 4}})[0]] == ["load-width",
                                                                                                 "store-width"]


def test_missing_rows_and_traffic_growth():
    findings, _ = g.compare_inspect({KEY: GOOD}, {})
    assert [f.rule for f in findings] == ["missing"]
    base = {"op/fwd/c": {"bytes_moved": 1000, "min_bytes": 1000, "error": None}}
    findings, _ = g.compare_traffic(base, {"op/fwd/c": {"bytes_moved": 1500, "min_bytes": 1000, "error": None}})
    assert [f.rule for f in findings] == ["bytes"] and "+50.00%: 1000 -> 1500" in findings[0].message
    findings, notes = g.compare_traffic(base, {"op/fwd/c": {"bytes_moved": 900, "min_bytes": 1000, "error": None}})
    assert findings == [] and "fell 1000 -> 900" in notes[0]


# ---------------------------------------------------------------------------------------------------
# Planted regressions in real compiled kernels.


def _bench_case(spec):
    return spec.bench_cases[:1]


def _block_too_large(la):
    """The norm backward with the 16384-column single-pass block it once had: registers overflow."""
    if la.name != "_norm_bwd_kernel":
        return la
    return dataclasses.replace(la, constexprs={**la.constexprs, "SINGLE_PASS": True, "BLOCK_N": 16384},
                               options={**la.options, "num_warps": 16})


def _misaligned_input(la):
    """x two bytes off 16-byte alignment: its loads lose their vector width."""
    args = tuple(dataclasses.replace(a, data_ptr=a.data_ptr + 2) if i == 0 and isinstance(a, TensorArg) else a
                 for i, a in enumerate(la.args))
    return dataclasses.replace(la, args=args)


@pytest.fixture(scope="module")
def baseline():
    report = inspect_ops(["rms_norm"], ["sm_90"], cases=_bench_case)
    return g.static_snapshot(report.as_dict(), {"rows": []})


def _gate(baseline, transform):
    report = inspect_ops(["rms_norm"], ["sm_90"], cases=_bench_case, transform=transform)
    return g.static_half(report.as_dict(), {"rows": []}, baseline)


def test_gate_passes_on_unchanged_kernels(baseline):
    result = _gate(baseline, None)
    assert result.passed and result.compared == 2


def test_planted_spill_is_caught(baseline):
    result = _gate(baseline, _block_too_large)
    rules = {(f.subject, f.rule) for f in result.findings}
    key = "rms_norm/bwd/llama3-8b_hidden/_norm_bwd_kernel@sm_90"
    assert {(key, "spills"), (key, "registers"), (key, "occupancy")} <= rules
    assert all(f.subject == key for f in result.findings)  # the forward is untouched


def test_planted_lost_vectorization_is_caught(baseline):
    result = _gate(baseline, _misaligned_input)
    assert {f.rule for f in result.findings} == {"load-width"}
    assert {f.subject.split("/")[1] for f in result.findings} == {"fwd", "bwd"}
    assert all("narrow (< 128-bit) global loads grew" in f.message for f in result.findings)


# ---------------------------------------------------------------------------------------------------
# The CLI, fed with documents (no compiling).


def _docs(tmp_path, inspect_rows, traffic_rows):
    i = tmp_path / "inspect.json"
    t = tmp_path / "traffic.json"
    i.write_text(json.dumps({"schema": "wavefront.inspect/1", "versions": {"triton": "3.9.0"}, "dtype": "bf16",
                             "targets": ["sm_90"], "rows": inspect_rows}))
    t.write_text(json.dumps({"schema": "wavefront.traffic/1", "rows": traffic_rows}))
    return i, t


def test_gate_cli_update_then_pass_then_fail(tmp_path):
    rows = [GOOD | {"key": KEY}]
    traffic = [{"key": "op/fwd/c", "bytes_moved": 1000, "min_bytes": 1000, "error": None}]
    i, t = _docs(tmp_path, rows, traffic)
    base = tmp_path / "static.json"
    app = build_app()
    common = ["gate", "--static", "--baseline", str(base), "--inspect", str(i), "--traffic", str(t)]
    missing = CliRunner().invoke(app, common)
    assert missing.exit_code == 2 and "wavefront gate --static --update" in missing.output
    assert CliRunner().invoke(app, [*common, "--update"]).exit_code == 0
    assert json.loads(base.read_text())["schema"] == g.BASELINE_SCHEMA
    ok = CliRunner().invoke(app, [*common, "--json", str(tmp_path / "gate.json")])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "gate.json").read_text())["passed"] is True
    worse = copy.deepcopy(rows)
    worse[0].update(spill_bytes=32, regs=80)
    i2, t2 = _docs(tmp_path, worse, traffic)
    bad = CliRunner().invoke(app, ["gate", "--static", "--baseline", str(base), "--inspect", str(i2), "--traffic",
                                   str(t2)])
    assert bad.exit_code == 1
    assert f"{KEY}: spills appeared" in bad.output and f"{KEY}: registers grew" in bad.output
    assert "FAIL (2 regressions)" in bad.output
    assert CliRunner().invoke(app, ["gate"]).exit_code == 2


def test_committed_baseline_keeps_hbm_passes_of_the_row_wise_ops():
    """The gate counts traffic with the taller run (jobs.gate: marginal=True), so the committed baseline holds
    HBM passes per row for the row-wise ops, and a kernel that reads its rows once more fails the gate."""
    base = g.load_baseline(Path(__file__).resolve().parents[3] / g.DEFAULT_STATIC_BASELINE)
    passes = {key: row["hbm_passes"] for key, row in base["traffic"].items() if row.get("hbm_passes") is not None}
    for op in ("softmax", "rms_norm", "cross_entropy"):
        rows = [v for k, v in passes.items() if k.startswith(f"{op}/fwd/")]
        assert rows, f"no {op} forward traffic row with hbm_passes in the baseline"
        assert all(0.5 < v < 4.0 for v in rows), (op, rows)
