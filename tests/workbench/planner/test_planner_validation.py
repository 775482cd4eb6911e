"""The cost model against published training runs (tests/data/published): per-row errors, medians, and
the tolerances this model honestly reaches. The errors are printed with -s; docs/planner.md lists them."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from wavefront.workbench.planner.training import CALIBRATED
from wavefront.workbench.planner.validation import fit_gemm_efficiency, load_table, validate

DATA = Path(__file__).resolve().parents[2] / "data" / "published"


def _report(name: str):
    rep = validate(load_table(DATA / f"{name}.json"))
    print(f"\n{name} ({rep.use})")
    for r in rep.rows:
        print(f"  {r.row:36s} {r.metric:22s} published {r.published:9.3f} predicted {r.predicted:9.3f} "
              f"error {r.rel_error:+7.1%}")
    for m in rep.metrics():
        print(f"  median |error| {m}: {rep.median_abs_error(m):.1%}")
    return rep


def test_every_table_has_a_source_and_documented_assumptions():
    for path in sorted(DATA.glob("*.json")):
        doc = load_table(path)
        assert doc["source"]["url"].startswith("https://")
        assert doc["source"]["citation"] and doc["source"]["transcription"]
        assert doc.get("assumed"), f"{path.name}: list the settings the source does not state"
        assert all(row["published"] for row in doc["rows"])


def test_narayanan2021_table1_throughput():
    """Calibration table: Efficiency.gemm for the A100 was fitted on it (median error minimised)."""
    rep = _report("narayanan2021_table1")
    assert len(rep.rows) == 10
    assert rep.median_abs_error("tflops_per_gpu") <= 0.05
    assert max(abs(r.rel_error) for r in rep.rows) <= 0.15
    assert all(r.fits for r in rep.rows)  # the published plans fit in 80 GB in the model too


def test_narayanan2021_table2_held_out():
    """Held out: same hardware, configurations not in Table 1 (PTD-P at three scales, and ZeRO-3)."""
    rep = _report("narayanan2021_table2")
    assert rep.median_abs_error("tflops_per_gpu") <= 0.06
    ptdp = [abs(r.rel_error) for r in rep.rows if r.row.startswith("PTD-P")]
    zero3 = [abs(r.rel_error) for r in rep.rows if r.row.startswith("ZeRO-3")]
    assert statistics.median(ptdp) <= 0.04 and max(ptdp) <= 0.08
    # DeepSpeed ZeRO-3 of 2021 is modelled more coarsely (per-micro-batch gathers, fixed overlap)
    assert statistics.median(zero3) <= 0.16 and max(zero3) <= 0.25
    # the scaling trend is right: per-GPU throughput falls as ZeRO-3 spreads over more GPUs
    by_id = {r.row: r.predicted for r in rep.rows}
    assert by_id["ZeRO-3 175B 384"] > by_id["ZeRO-3 175B 768"] > by_id["ZeRO-3 175B 1536"]


def test_korthikanti2022_layer_and_iteration_time():
    """Held out (A100 constants from Narayanan Table 1): one 22B layer under the five recomputation /
    sequence-parallel settings of Table 4, and the iteration times of Table 5."""
    rep = _report("korthikanti2022")
    assert rep.median_abs_error("layer_ms") <= 0.03
    assert max(abs(r.rel_error) for r in rep.rows if r.metric == "layer_ms") <= 0.06
    assert rep.median_abs_error("step_s") <= 0.06
    assert max(abs(r.rel_error) for r in rep.rows if r.metric == "step_s") <= 0.10
    # the paper's headline: SP + selective recomputation beats full recomputation at every size
    by_id = {r.row: r.predicted for r in rep.rows}
    for size in ("22B", "175B", "530B", "1T"):
        assert by_id[f"T5 {size} present work"] < by_id[f"T5 {size} full recompute"]


def test_llama3_table4():
    """Row 1 calibrated the H100 matmul efficiency; rows 2 and 3 are held out. The 128K row is
    over-predicted: the model's flash-attention cost (causal half, FA2 efficiency) is cheaper than
    what the published figure implies under the PaLM (non-causal) FLOP count."""
    rep = _report("llama3_2024_table4")
    by_id = {r.row: r for r in rep.rows}
    assert abs(by_id["8K-8192"].rel_error) <= 0.01
    assert abs(by_id["8K-16384"].rel_error) <= 0.05
    assert abs(by_id["128K-16384"].rel_error) <= 0.40
    assert rep.median_abs_error("tflops_per_gpu") <= 0.05


def test_torchtitan_relative_throughput_and_memory_bounds():
    rep = _report("torchtitan_llama3_h100_202412")
    ratios = [r for r in rep.rows if r.metric == "tokens_per_s_per_gpu"]
    assert len(ratios) == 8
    assert rep.median_abs_error("tokens_per_s_per_gpu") <= 0.30
    # direction of every change is right: longer sequences per GPU and more GPUs lower TPS/GPU;
    # the interleaved schedule raises it
    for r in ratios:
        assert (r.published > 1) == (r.predicted > 1), r.row
    # torchtitan reports the caching allocator's reserved peak, an upper bound of what is allocated:
    # with full recomputation the model's allocation stays below it (the 5% memory goal cannot be checked
    # against reserved numbers; docs/planner.md)
    doc = json.loads((DATA / "torchtitan_llama3_h100_202412.json").read_text())
    full = {row["id"] for row in doc["rows"] if row.get("recompute") == "full"}
    mem = [r for r in rep.rows if r.metric == "memory_gib" and r.row in full]
    assert len(mem) == 11 and all(r.predicted <= r.published for r in mem)


@pytest.mark.parametrize(("table", "gpu", "rows"), [
    ("narayanan2021_table1", "a100", None),
    ("llama3_2024_table4", "h100", ["8K-8192"]),
])
def test_calibrated_constants_are_the_fit(table, gpu, rows):
    fitted = fit_gemm_efficiency(load_table(DATA / f"{table}.json"), rows=rows)
    assert fitted == pytest.approx(CALIBRATED[gpu][0], abs=0.005)
