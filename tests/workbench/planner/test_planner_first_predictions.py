"""Blind first predictions are history: tests/data/published/first_predictions/blind.json keeps every row of
each table as the planner of that prediction priced it. The record must describe the tables as they are
now (same rows, splits and published figures), its statistics are the ones the docs and notes cite, and the
rows whose pricing the planner has not changed since are still reproduced by it, with the record's
constants: that ties the record to the code that wrote it."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from wavefront.workbench.planner import time as planner_time
from wavefront.workbench.planner.kernels import ATTENTION_KERNEL_SPEEDUP
from wavefront.workbench.planner.stacks import get_profile
from wavefront.workbench.planner.validation import THROUGHPUT_METRICS, load_table, priced_with, validate

DATA = Path(__file__).parents[2] / "data" / "published"
RECORD = json.loads((DATA / "first_predictions" / "blind.json").read_text())
BY_NAME = {p["name"]: p for p in RECORD["predictions"]}


def _errors(name: str, table: str | None = None, split: str = "held-out") -> list[float]:
    return [r["predicted"] / r["published"] - 1.0 for r in BY_NAME[name]["rows"]
            if r["split"] == split and (table is None or r["table"] == table)]


def _table_doc(name: str, table: str) -> dict:
    """The table as the prediction priced it: without the recipe facts where it predates them, with the
    attention kernel it assumed where that assumption was revised since."""
    doc = load_table(DATA / "validation" / f"{table}.json")
    if not BY_NAME[name]["recipe_facts"]:
        doc["defaults"].pop("recipes", None)
    if "attention_kernel" in BY_NAME[name]:
        doc["defaults"]["attention_kernel"] = BY_NAME[name]["attention_kernel"]
    return doc


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_record_holds_every_row_of_its_tables_as_they_are(name):
    pred = BY_NAME[name]
    for table in {r["table"] for r in pred["rows"]}:
        doc = load_table(DATA / "validation" / f"{table}.json")
        want = sorted((str(row["id"]), m, row["split"], float(row["published"][m])) for row in doc["rows"]
                      for m in THROUGHPUT_METRICS if row["published"].get(m) is not None)
        have = sorted((r["row"], r["metric"], r["split"], r["published"]) for r in pred["rows"] if r["table"] == table)
        assert have == want


def test_first_prediction_figures():
    """GB200 dense, blind: Megatron-Bridge 6.6% held-out median (signed +2.4%), NeMo 4.0%, 5.6% over the 17
    rows (goal 8%). GB200 MoE, blind: 12.2% over 21, signed -12.2%, every Qwen3-235B-A22B row 32-49% slow.
    Megatron-Bridge 26.02.01-26.06 MoE, blind: 41.1%, every held-out row slow. Megatron-Bridge 26.02 MoE,
    blind twice: 28.6% before that round's MoE changes, 9.8% with them. NeMo 25.04's B200 long sequences:
    32.0%, worse with every longer sequence (no blind test of the planner since: it was changed on seeing it).
    NeMo 24.03's H100 long sequences: 10.2%, signed +10.2%, from -13% at 4K to +13% at 1M (its attention
    assumption was revised on seeing it: no blind test since). NeMo 24.09 on DGX-H100 (DGX Cloud recipes),
    blind: 1.2% over 25 held-out runs, its FP8 405B rows 11-15% slow, one plan that ran priced over its
    device (405B BF16 on 576 GPUs, by 0.2 GB)."""
    def med(errs: list[float]) -> float:
        return statistics.median(abs(e) for e in errs)

    mb, nemo = _errors("gb200-dense", "megatron_bridge_gb200"), _errors("gb200-dense", "nemo_2504_2507_gb200")
    assert (len(mb), len(nemo)) == (9, 8)
    assert med(mb) == pytest.approx(0.0657, abs=5e-4) and statistics.median(mb) == pytest.approx(0.0239, abs=5e-4)
    assert med(nemo) == pytest.approx(0.0400, abs=5e-4)
    assert med(mb + nemo) == pytest.approx(0.0557, abs=5e-4) and med(mb + nemo) <= 0.08
    moe = _errors("gb200-moe")
    assert len(moe) == 21 and med(moe) == pytest.approx(0.122, abs=5e-4)
    assert statistics.median(moe) == pytest.approx(-0.122, abs=5e-4)
    qwen = [r["predicted"] / r["published"] - 1.0 for r in BY_NAME["gb200-moe"]["rows"]
            if "qwen3-235b" in r["row"]]  # calibration row included
    assert len(qwen) == 8 and max(qwen) < -0.3
    mb26 = _errors("mb-26x-moe")
    assert len(mb26) == 6 and all(e < 0 for e in mb26) and med(mb26) == pytest.approx(0.411, abs=5e-4)
    before, after = _errors("mb-2602-moe-before"), _errors("mb-2602-moe-after")
    assert len(before) == len(after) == 3
    assert med(before) == pytest.approx(0.286, abs=5e-4) and med(after) == pytest.approx(0.098, abs=5e-4)
    b200 = _errors("b200-long-sequence")
    assert med(b200) == pytest.approx(0.320, abs=5e-4) and b200 == sorted(b200, reverse=True)
    dgxc = _errors("dgxc-nemo-2409")
    assert len(dgxc) == 25 and med(dgxc) == pytest.approx(0.0118, abs=5e-4) and med(dgxc) <= 0.08
    assert statistics.median(dgxc) == pytest.approx(-0.0118, abs=5e-4)
    fp8_405b = [r["predicted"] / r["published"] - 1.0 for r in BY_NAME["dgxc-nemo-2409"]["rows"]
                if "405b" in r["row"] and " fp8 " in r["row"] and "2304gpu" not in r["row"]]
    assert len(fp8_405b) == 5 and all(-0.15 < e < -0.11 for e in fp8_405b)
    over = [r["row"] for r in BY_NAME["dgxc-nemo-2409"]["rows"] if not r["fits"]]
    assert over == ["llama3.1-405b-126l bf16 576gpu tp8 pp9 cp2 vp7 dp4 mb1 gbs252"]
    h100 = _errors("nemo-2403-long-sequence")
    assert len(h100) == 7 and med(h100) == pytest.approx(0.102, abs=5e-4) and med(h100) > 0.08
    assert statistics.median(h100) == pytest.approx(0.102, abs=5e-4)
    seq = [int(r["row"].split()[1][3:-1]) for r in BY_NAME["nemo-2403-long-sequence"]["rows"]]
    assert seq == sorted(seq)  # rows in sequence order: the error grows with it up to 256K
    every = [r["predicted"] / r["published"] - 1.0 for r in BY_NAME["nemo-2403-long-sequence"]["rows"]]
    assert every[:7] == sorted(every[:7]) and every[0] < -0.1 and every[-1] > 0.1


def _unchanged(plan: str) -> bool:
    """Plans without a pipeline: the one change to pricing since the record (time.step_time takes the busiest
    pipeline rank with the memory model's layer layout) leaves them as they were."""
    return " pp1 " in f" {plan} "


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rows_the_planner_prices_as_then_are_reproduced(name, monkeypatch):
    pred = BY_NAME[name]
    if name == "b200-long-sequence":  # priced before cuDNN's factor applied on Blackwell
        monkeypatch.setattr(planner_time, "attention_kernel_speedup",
                            lambda kernel, gpu: ATTENTION_KERNEL_SPEEDUP[kernel] if gpu.arch == "sm_90" else 1.0)
    profile = get_profile(pred.get("profile", "megatron-core-te/2025"))
    trial = replace(profile, fitted=pred["constants"])
    recorded = {(r["table"], r["row"], r["metric"]): r for r in pred["rows"]}
    checked = 0
    for table in {r["table"] for r in pred["rows"]}:
        rep = validate(_table_doc(name, table), efficiency_for=priced_with(trial))
        for r in rep.rows:
            old = recorded[(table, r.row, r.metric)]
            if _unchanged(old["plan"]):
                assert r.plan == old["plan"]
                assert r.predicted == pytest.approx(old["predicted"], rel=1e-5), (table, r.row)
                checked += 1
    assert checked >= 1
