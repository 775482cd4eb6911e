"""`wavefront counters`: the JSON document is the library's, tables print, bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.jobs import counters as job

DATA = Path(__file__).resolve().parents[1] / "data" / "counters"
NCU_A, NCU_B = str(DATA / "ncu_raw_h100_a.csv"), str(DATA / "ncu_raw_h100_b.csv")
INSPECT, TRAFFIC = str(DATA / "inspect_rms_norm.json"), str(DATA / "traffic_rms_norm.json")


def _invoke(*args: str):
    return CliRunner().invoke(build_app(), ["counters", *args])


def test_json_equals_the_library_call():
    r = _invoke(NCU_A, "--inspect", INSPECT, "--traffic", TRAFFIC, "--json", "-")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc == json.loads(json.dumps(job.counters(job.CountersRequest(NCU_A, None, INSPECT, TRAFFIC)).as_dict()))


def test_table_and_gaps():
    r = _invoke(NCU_A, "--inspect", INSPECT, "--traffic", TRAFFIC)
    assert r.exit_code == 0, r.output
    assert "_norm_fwd_kernel" in r.output and "NVIDIA H100 SXM" in r.output
    assert "gap: _norm_bwd_kernel #5: DRAM bytes 6.99x the traffic prediction" in r.output


def test_two_profiles_compare():
    r = _invoke(NCU_A, NCU_B, "--json", "-")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "wavefront.counters.compare/1"
    assert {d["method"] for d in doc["deltas"]} == {"stats", "delta"}
    text = _invoke(NCU_A, NCU_B).output
    assert "delta only (n=1/1)" in text and "lower" in text


@pytest.mark.parametrize("args, expected", [
    ((INSPECT,), "a JSON document; counters are read from CSV"),
    ((str(DATA / "rocprofv3_counter_collection_mi300x.csv"),), "--device: "),
    ((NCU_A, "--device", "z80"), "--device: unknown GPU 'z80'"),
    ((NCU_A, "--inspect", TRAFFIC), "--inspect: "),
    ((NCU_A, NCU_B, "--inspect", INSPECT), "apply to one profile"),
    (("/nonexistent/profile.csv",), "cannot read"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    r = _invoke(*args)
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in r.output
