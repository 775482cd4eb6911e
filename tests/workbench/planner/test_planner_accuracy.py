"""The held-out accuracy of the planner on published runs: the split is the committed one, the fitted
constants are the fit of the calibration rows only, and docs/planner.md states the computed figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _planner_docs import DOCS, documented, summary_lines

from wavefront.workbench.planner.stacks import CALIBRATION_ROWS, FITTED, PROFILES, get_profile
from wavefront.workbench.planner.validation import (
    MOE_REPORT_TABLES,
    REPORT_TABLES,
    calibration_row_names,
    fit_all,
    load_table,
    profile_loss,
    report_tables,
    source_of,
    split_of,
    split_summaries,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "published"
#: The goals (issue 29) and what the model reaches: a figure above its goal is guarded at the reached value
#: (it may only improve), one at or under it at the goal.
HELD_OUT_MEDIAN_GOAL, HELD_OUT_P90_GOAL = 0.05, 0.15
#: under the goal since the non-reentrant checkpoint's early stop (5.1% before); 4.5% until time.step_time took
#: the busiest rank of the memory model's pipeline layout (4.6% since, and with the interleaved transfers); 4.5%
#: since the interleaved schedule's data-parallel sync is priced per model chunk
#: 4.3% over 250 since the DGX Cloud NeMo 24.09 table (25 held-out runs at 1.2%) joined
HELD_OUT_MEDIAN_REACHED = 0.043
#: 12.0% over the 225 runs since the per-chunk data-parallel sync (13.1% before it, 12.7% before the
#: interleaved schedule's critical-path transfers were priced,
#: 14.1% before the busiest-rank layout, 13.4% over 208 before the GB200 tables); 13.4% over the 190 of the
#: tables that predate this round's new tables (13.0% before the transfers, 14.6% before the layout, 15.2%
#: before cuDNN was priced on Blackwell, 17.1% before the early stop)
#: 11.6% since NeMo 24.03.01's table states the FlashAttention-2 its Transformer Engine ran (12.0% before);
#: 12.1% over 250 since the NeMo 24.09 table joined (its FP8 405B rows are 12-14% slow)
HELD_OUT_P90_REACHED = 0.121
#: tables added this round: nemo_2403_long_sequence, nemo_2504_long_sequence_b200, megatron_bridge_2602_2606,
#: megatron_bridge_gb200, nemo_2504_2507_gb200, dgxc_nemo_2409_h100
NEW_TABLE_GOAL = 0.08
#: megatron_bridge_2602_2606's first (blind) prediction, all 5 rows held-out: 10.3%; 9.8% once the GB200
#: calibration rows joined the profile's fit (its H100 constants moved with them); 10.2% since the interleaved
#: schedule's critical-path transfers are priced (found by running the schedule, test_planner_schedule.py):
#: the profile's one H100 calibration row, GPT-3 175B at PP8 VP6, slowed by 1%, so the refit made H100
#: compute 1% faster, and this table's Llama 3 plans, with few transfers, read 0.4 points more optimistic.
#: The guard follows the model that is right by construction, not the better number. 6.8% since the
#: interleaved schedule's data-parallel sync is priced per model chunk (a change made with this table's H100
#: errors in view: docs/planner.md), so under the goal and guarded at it; 10.3% stays its blind figure.
MB_2606_REACHED = 0.068
#: nemo_2403's first prediction (blind, cuDNN attention assumed): 10.2% (test_planner_first_predictions.py);
#: 6.5% since the table states FlashAttention-2, what NeMo 24.03.01's Transformer Engine ranked first (a
#: revision made with both figures in view: docs/planner.md), so it is guarded at the goal but no blind test
#: nemo_2504's first prediction was 32.0% (test_planner_first_predictions.py); 0.7% after two changes made on
#: seeing it (docs/planner.md), so it is guarded at the goal but is no blind test
#: torchtitan_a100_2024, added last round: 9.7% until the early stop (its full and every-other calibration
#: rows had set a scale that priced its no-recompute and per-op rows 9-17% fast)
TORCHTITAN_A100_REACHED = 0.027


def _overall(stated: bool = True, split: str = "held-out"):
    return next(s for s in split_summaries(report_tables(DATA, stated=stated), split) if s.source == "overall")


def test_validation_set_is_broad_and_its_split_is_the_hash_rule():
    rows, sources = 0, set()
    for rel in REPORT_TABLES:
        doc = load_table(DATA / rel)
        sources.add(source_of(doc))
        assert doc["source"]["url"].startswith("https://") and doc.get("assumed")
        for row in doc["rows"]:
            assert row["split"] == split_of(doc["name"], str(row["id"])), (doc["name"], row["id"])
            rows += 1
    assert rows >= 60 and len(sources) >= 4


def test_docs_state_the_computed_held_out_figures():
    """docs/planner.md's accuracy tables are what split_summaries computes from the committed data: each
    run priced with its own stack profile, and with the default profile (no --stack) beside it."""
    assert documented("accuracy-table") == summary_lines(report_tables(DATA))
    assert documented("default-accuracy-table") == summary_lines(report_tables(DATA, stated=False))
    overall = _overall()
    n_sources = len({source_of(load_table(DATA / r)) for r in REPORT_TABLES})
    assert (f"median absolute error {overall.median_abs_error:.1%} over {overall.n_runs} runs from "
            f"{n_sources} sources") in " ".join(DOCS.read_text().split())


def test_held_out_accuracy_with_stacks_stated_holds_its_goals():
    """Over every non-MoE held-out run (250), each priced with its stack profile: median 4.3% against a goal
    of 5% and p90 12.1% against 15%; the tables added this round: NeMo 24.09 on DGX-H100 1.2% (blind, its
    first prediction: test_planner_first_predictions.py), NeMo 24.03's long sequences 6.5% against 8%
    (10.2% at its blind first prediction), NeMo 25.04's B200 long sequences 1.0% (guarded at the goal;
    32.0% at its first prediction), Megatron-Bridge 26.02.01-26.06 6.8% (10.3% blind), the GB200
    tables 3.1% and 3.0% (6.6% and 4.0% blind: test_planner_first_predictions.py); torchtitan's A100 table
    (added last round) 2.7%."""
    summaries = split_summaries(report_tables(DATA))
    overall = next(s for s in summaries if s.source == "overall")
    assert overall.n_runs == 250
    assert overall.median_abs_error <= max(HELD_OUT_MEDIAN_GOAL, HELD_OUT_MEDIAN_REACHED) + 5e-4
    assert overall.p90_abs_error <= max(HELD_OUT_P90_GOAL, HELD_OUT_P90_REACHED) + 5e-4
    assert abs(overall.signed_median_error) <= 0.05
    new = next(s for s in summaries if s.source == "nemo_2403_long_sequence")
    assert new.n_runs == 7 and new.median_abs_error <= NEW_TABLE_GOAL
    b200 = next(s for s in summaries if s.source == "nemo_2504_long_sequence_b200")
    assert b200.n_runs == 6 and b200.median_abs_error <= NEW_TABLE_GOAL
    mb26 = next(s for s in summaries if s.source == "megatron_bridge_2602_2606")
    assert mb26.n_runs == 5 and mb26.median_abs_error <= max(NEW_TABLE_GOAL, MB_2606_REACHED) + 5e-4
    for name, n in (("megatron_bridge_gb200", 9), ("nemo_2504_2507_gb200", 8)):
        gb200 = next(s for s in summaries if s.source == name)
        assert gb200.n_runs == n and gb200.median_abs_error <= NEW_TABLE_GOAL
    dgxc = next(s for s in summaries if s.source == "dgxc_nemo_2409_h100")
    assert dgxc.n_runs == 25 and dgxc.median_abs_error <= NEW_TABLE_GOAL
    titan = next(s for s in summaries if s.source == "torchtitan_a100_2024")
    assert titan.n_runs == 6 and titan.median_abs_error <= max(NEW_TABLE_GOAL, TORCHTITAN_A100_REACHED) + 5e-4


def test_default_profile_is_reported_and_worse_than_stated():
    """Without --stack every run is priced as wavefront-train's profile (physics defaults, no calibration
    rows of its own): the published stacks differ from it, and the report says by how much."""
    stated, default = _overall(), _overall(stated=False)
    assert default.n_runs == stated.n_runs
    assert default.median_abs_error > stated.median_abs_error


def test_every_row_names_a_profile_that_lists_its_table():
    for rel in REPORT_TABLES + MOE_REPORT_TABLES:
        doc = load_table(DATA / rel)
        for row in doc["rows"]:
            name = row.get("profile", doc["defaults"].get("profile"))
            assert name in PROFILES, (doc["name"], row["id"])
            assert doc["name"] in get_profile(name).tables


def test_a_profile_is_fitted_only_on_its_own_calibration_rows():
    """Every row a profile was fitted on is a calibration row of one of its own tables priced with it."""
    for key, profile in PROFILES.items():
        assert profile.calibration_rows == calibration_row_names(DATA, profile), key
        for name in profile.calibration_rows:
            table, _, row_id = name.partition("/")
            assert table in profile.tables and split_of(table, row_id) == "calibration", name
        if not profile.fitted:
            assert all(how == "physics" for _, how in profile.constants("h100").values())


def test_committed_constants_are_the_fit():
    """The committed per-profile constants are what fit_profile gives on the committed data (about 5 s)."""
    fits = fit_all(DATA)
    assert {k: f["fitted"] for k, f in fits.items() if f["fitted"]} == FITTED
    rows = {k: f["calibration_rows"] for k, f in fits.items() if f["calibration_rows"]}
    assert rows == CALIBRATION_ROWS


def test_held_out_rows_never_enter_the_fit(tmp_path):
    """Changing a held-out published figure leaves a profile's fitted loss untouched, and so does changing
    another stack's calibration row; changing its own calibration row moves it."""
    root = tmp_path / "published"
    shutil.copytree(DATA, root)
    foundry, nemo = get_profile("llm-foundry/2023"), get_profile("nemo/24.07")
    params = {"h100.scale": 0.9}
    base, base_foundry = profile_loss(root, nemo, params), profile_loss(root, foundry, {"a100.gemm": 0.7})

    def bump(rel: str, split: str) -> None:
        path = root / rel
        doc = json.loads(path.read_text())
        row = next(r for r in doc["rows"] if r["split"] == split)
        row["published"]["tokens_per_s_per_gpu"] *= 10
        path.write_text(json.dumps(doc))

    bump("validation/nemo_2407_h100_fp8.json", "held-out")
    assert profile_loss(root, nemo, params) == base
    bump("validation/nemo_2407_h100_fp8.json", "calibration")
    assert profile_loss(root, nemo, params) > base
    assert profile_loss(root, foundry, {"a100.gemm": 0.7}) == base_foundry  # another stack's row
