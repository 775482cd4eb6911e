"""Software stacks as named, versioned profiles (planner/stacks.py): selection, the header and default
lines, --explain, old names, bad names, and the MoE terms priced per profile."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from _planner_docs import DOCS, documented
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.planner import PlanConfig, PlanRequest, Training, make_cluster, plan
from wavefront.workbench.planner.memory import memory_breakdown
from wavefront.workbench.planner.moe import MOE_MODELS
from wavefront.workbench.planner.search import _as_model, evaluate
from wavefront.workbench.planner.stacks import (
    DEFAULT_PROFILE,
    DEPRECATED,
    PROFILES,
    explain_stack,
    get_profile,
    resolve,
)
from wavefront.workbench.planner.training import PHYSICS_FAMILY
from wavefront.workbench.planner.validation import MOE_REPORT_TABLES, report_tables, split_summaries

DATA = Path(__file__).resolve().parents[2] / "data" / "published"
#: MoE held-out median: goal 15% (issue 29). 20.0% over 18 runs after the blind Megatron-Bridge 26.02.01-26.06
#: table; 10.8% over 21 since the recipes' stated dispatchers, overlaps and recompute modules (recipes.py) and
#: the blind 26.02 table (docs/planner.md, MoE accuracy, says which rows were seen before the change).
MOE_HELD_OUT_GOAL = 0.15


def _run(*args: str):
    return CliRunner().invoke(build_app(), ["plan", *args])


def test_profiles_are_named_versioned_and_the_default_is_wavefront_train():
    assert DEFAULT_PROFILE.startswith("wavefront-train/") and DEFAULT_PROFILE in PROFILES
    for key, p in PROFILES.items():
        assert key == f"{p.name}/{p.version}" and p.what and p.kernel_family in ("megatron", "fsdp")
    for name in ("megatron-core-te/2025", "torchtitan/2025", "llm-foundry/2023", "deepspeed/2021", "nemo/24.07"):
        assert name in PROFILES
    assert get_profile("nemo/25.02").key == "megatron-core-te/2025"  # a release of that stack
    assert get_profile("torchtitan").key == "torchtitan/2025"  # the only version: the name alone works


def test_a_profile_without_calibration_rows_prices_with_physics_defaults_not_another_stacks_fit():
    titan = get_profile("torchtitan/2025")
    assert not titan.calibration_rows and not titan.fitted
    eff = titan.efficiency("h100")
    assert (eff.gemm, eff.attention) == (PHYSICS_FAMILY["h100"]["gemm"], PHYSICS_FAMILY["h100"]["attention"])
    assert "physics defaults" in eff.source
    foundry = get_profile("llm-foundry/2023").efficiency("h100")
    assert foundry.gemm != eff.gemm and "fitted on its 56 calibration rows" in foundry.source


def test_stack_selects_the_profile_and_its_facts():
    """--stack sets the attention kernel, TP overlap, CP exchange and collectives of the profile; a flag
    stated beside it wins."""
    req = PlanRequest(model="llama3-8b", gpus=("8xh100",), stack="meta-llama3/2024")
    tr = req.training(req.model_spec())
    assert (tr.cp_comm, tr.tp_overlap, tr.attention_kernel) == ("all-gather", 0.0, "fa2")
    req = replace(req, stack="nemo/24.07", tp_overlap=0.2)
    tr = req.training(req.model_spec())
    assert (tr.attention_kernel, tr.tp_overlap, tr.stack) == ("cudnn", 0.2, "megatron")
    assert not PlanRequest(model="llama3-70b", gpus=("16xa100",), stack="deepspeed/2021").clusters()[0].hierarchical
    fast = plan(PlanRequest(model="llama3-8b", gpus=("8xh100",), stack="megatron-core-te/2025", top=1))
    slow = plan(PlanRequest(model="llama3-8b", gpus=("8xh100",), stack="llm-foundry/2023", top=1))
    assert fast.best.time.step_s < slow.best.time.step_s  # priced per stack


def test_explain_prints_the_profile_terms_and_its_calibration_rows():
    result = _run("--stack", "nemo/24.07", "--explain")
    assert result.exit_code == 0, result.output
    text = re.sub(r"\s+", " ", result.output)
    assert "stack profile nemo/24.07" in text and "TP overlap 0.5" in text and "attention cudnn" in text
    profile = get_profile("nemo/24.07")
    assert len(profile.calibration_rows) == 3
    for row in profile.calibration_rows:
        assert row in text
    assert f"gemm {profile.fitted['h100']['gemm']:g} (fitted)" in text and "kernel_us 4 (physics)" in text
    titan = " ".join(explain_stack("torchtitan/2025"))
    assert "no calibration rows of this stack" in titan
    default = explain_stack(None)
    assert default[0] == f"stack profile defaulted to {DEFAULT_PROFILE} (`wavefront train`'s own)"


def test_explain_with_a_model_prints_the_profile_and_the_plan():
    result = _run("--model", "llama3-8b", "--gpus", "8xh100", "--top", "1", "--stack", "llm-foundry/2023", "--explain")
    assert result.exit_code == 0, result.output
    text = re.sub(r"\s+", " ", result.output)
    assert "fitted on 56 calibration rows" in text and "best 1 by step time" in text
    piped = _run("--model", "llama3-8b", "--top", "1", "--stack", "llm-foundry/2023", "--explain", "--json", "-")
    assert piped.exit_code == 0 and json.loads(piped.stdout)["stack_profile"]["key"] == "llm-foundry/2023"


def test_a_name_without_a_version_means_its_newest_profile():
    """`--stack nemo` and `--stack torchtitan` (two versions each) mean the newest; a one-version name its
    only profile."""
    assert resolve("nemo") == (get_profile("nemo/24.07"), None)
    assert resolve("torchtitan")[0].key == "torchtitan/2025"
    assert resolve("llm-foundry")[0].key == "llm-foundry/2023"


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_old_stack_names_map_to_a_profile_with_a_deprecation_line(old, tmp_path):
    profile, line = resolve(old)
    assert profile.key == DEPRECATED[old] and f"--stack {old} is deprecated" in line
    out = tmp_path / "p.json"
    result = _run("--model", "llama3-8b", "--gpus", "8xh100", "--top", "1", "--stack", old, "--json", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["stack_profile"]["key"] == DEPRECATED[old]
    assert any(f"--stack {old} is deprecated" in w for w in doc["warnings"])
    assert f"--stack {old} is deprecated" in re.sub(r"\s+", " ", result.output)


@pytest.mark.parametrize("extra", [(), ("--explain",)])
def test_a_bad_profile_name_exits_2_naming_stack(extra):
    result = _run("--model", "llama3-8b", "--stack", "megatron-core-te/1999", *extra)
    assert result.exit_code == 2
    assert "--stack" in result.output and "megatron-core-te/2025" in result.output
    assert "Traceback" not in result.output


def test_moe_held_out_accuracy_per_profile():
    """MoE held-out median with each run's profile and its recipe's stated facts: 12.6% over 42 runs (goal 15%;
    10.9% until time.step_time took the busiest rank of the memory model's pipeline layout, 12.2% until the
    interleaved schedule's critical-path transfers were priced). 18 of them were seen before the recipe facts
    and the overlap bound were added (after the 26.02.01-26.06 table's first prediction, 41.1%); 24 were
    priced blind: Megatron-Bridge 26.02's 3 (9.8%) and the GB200 table's 21 (12.2% blind; 9.1% now)."""
    reps = report_tables(DATA, tables=MOE_REPORT_TABLES)
    summaries = split_summaries(reps)
    overall = next(s for s in summaries if s.source == "overall")
    assert overall.n_runs == 42
    assert overall.median_abs_error <= MOE_HELD_OUT_GOAL
    gb200 = next(s for s in summaries if s.source == "megatron_bridge_gb200_moe")
    assert gb200.n_runs == 21 and gb200.median_abs_error <= MOE_HELD_OUT_GOAL


def test_moe_dispatcher_cost_is_a_profile_constant_fitted_on_its_own_moe_rows():
    te = get_profile("megatron-core-te/2025")
    assert te.fitted["shared"]["moe_layer_us"] > 0
    assert any(r.startswith("megatron_bridge_25") and "_moe/" in r for r in te.calibration_rows)
    assert get_profile("torchtitan/2025").efficiency("h100").moe_layer_us == 0.0  # physics: not measured
    spec, cluster = _as_model("qwen3-30b-a3b"), make_cluster("8xh100")
    cfg, training = PlanConfig(dp=8, ep=8), Training(global_batch_tokens=64 * 4096, seq_len=4096)
    slow = evaluate(spec, cfg, training, cluster, te.efficiency("h100"))
    free = evaluate(spec, cfg, training, cluster, replace(te.efficiency("h100"), moe_layer_us=0.0))
    n_moe = MOE_MODELS["qwen3-30b-a3b"].dims.n_layers
    extra = 3 * te.fitted["shared"]["moe_layer_us"] * 1e-6 * n_moe * slow.time.n_micro
    assert slow.time.step_s - free.time.step_s == pytest.approx(extra, rel=1e-6)


def test_capacity_factor_caps_and_pads_the_busiest_experts_rows():
    spec, cluster = _as_model("mixtral-8x7b"), make_cluster("16xh100")
    cfg = PlanConfig(dp=16, ep=8, zero=3)
    base = Training(global_batch_tokens=64 * 4096, seq_len=4096, moe_imbalance=1.5)
    capped = replace(base, moe_capacity_factor=1.25)
    assert capped.moe_rows_factor == 1.25 and base.moe_rows_factor == 1.5
    t_base = evaluate(spec, cfg, base, cluster).time
    t_cap = evaluate(spec, cfg, capped, cluster).time
    assert t_cap.step_s < t_base.step_s and t_cap.ep_comm_s < t_base.ep_comm_s
    padded = evaluate(spec, cfg, replace(base, moe_imbalance=1.0, moe_capacity_factor=1.5), cluster).time
    assert padded.step_s == pytest.approx(t_base.step_s)  # padded to 1.5 x the mean = imbalance 1.5
    with pytest.raises(ValueError, match="moe_capacity_factor"):
        replace(base, moe_capacity_factor=0.0)


def test_per_op_recomputation_of_matmuls_is_a_profile_fact():
    """torchtitan's per-op checkpointing reruns every second matmul of a block by count (its policy's
    counter: the 2nd, 4th and 6th mm, k, o and up in a Llama block), where wavefront-train's policy keeps
    every matmul output. Time and memory price the same matmuls (model.op_policy_fractions): for Llama 3
    8B the rerun is h (kv + q + f) of the matmul forward's h (q + 2 kv + q + 3 f), 37%, and the outputs kept
    are q, v, gate and down, 55% of the output bytes."""
    from wavefront.workbench.planner.model import (
        layer_activation_bytes,
        layer_matmul_flops,
        layer_matmuls,
        op_policy_fractions,
        op_recomputed_matmuls,
    )
    from wavefront.workbench.planner.time import layer_compute_s

    spec, cluster = _as_model("llama3-8b"), make_cluster("8xh100")
    assert [n for n, _, _ in layer_matmuls(spec)] == ["q", "k", "v", "o", "gate", "up", "down"]
    assert op_recomputed_matmuls(7, 0.5) == [False, True, False, True, False, True, False]
    assert op_recomputed_matmuls(7, 0.0) == [False] * 7 and op_recomputed_matmuls(7, 1.0) == [True] * 7
    h, q, kv, f = 4096.0, float(spec.q_dim), float(spec.kv_dim), 14336.0
    rerun, kept = op_policy_fractions(spec, 0.5)
    assert rerun == pytest.approx((kv + q + f) / (q + 2 * kv + q + 3 * f))
    assert kept == pytest.approx((q + kv + f + h) / (q + 2 * kv + h + 2 * f + h))
    cfg = PlanConfig(dp=8, recompute="op")
    eff = get_profile("torchtitan/2025").efficiency("h100")
    ours = Training(global_batch_tokens=8 * 8192, seq_len=8192)
    titan = replace(ours, op_recompute_mm=get_profile("torchtitan/2025").op_recompute_mm)
    assert get_profile(DEFAULT_PROFILE).op_recompute_mm == 0.0 and titan.op_recompute_mm == 0.5
    extra = layer_compute_s(spec, cfg, titan, cluster, eff)[0] - layer_compute_s(spec, cfg, ours, cluster, eff)[0]
    flops = layer_matmul_flops(spec, 8192)
    peak = cluster.gpu.peak_tflops("bf16") * 1e12 * eff.gemm
    assert rerun * flops / peak < extra < 1.5 * rerun * flops / peak  # the rerun share, tile-quantised
    kw = dict(seq_len=8192, micro_batch=1, tp=1, sp=False, recompute="op")
    full, part = layer_activation_bytes(spec, **kw), layer_activation_bytes(spec, **kw, op_saved_mm=kept)
    s = 8192.0
    mm_out = 4 * s * h + 2 * s * (spec.q_dim + 2 * spec.kv_dim) + 2 * 2 * s * f
    assert full - part == pytest.approx((1 - kept) * mm_out)
    # the memory model prices the same policy: the torchtitan plan holds the rerun matmuls' outputs less
    mem_ours = memory_breakdown(spec, cfg, ours, cluster)
    mem_titan = memory_breakdown(spec, cfg, titan, cluster)
    assert mem_ours.activations_bytes - mem_titan.activations_bytes == pytest.approx(
        spec.dims.n_layers * (1 - kept) * mm_out)


def _profile_table_lines() -> list[str]:
    """docs/planner.md's profile table as the code has it: each profile's facts, its constants per GPU family
    ("(fit)" where its own calibration rows fitted them) and its calibration rows, dense + MoE."""
    lines = []
    for key, p in PROFILES.items():
        cells = []
        for fam in ("a100", "h100", "b200"):
            c = p.constants(fam)
            cells.append(f"{c['gemm'][0]:.3f} / {c['attention'][0]:.3f}" + (" (fit)" if fam in p.fitted else ""))
        n_moe = sum(1 for r in p.calibration_rows if r.split("/")[0].endswith("_moe"))
        rows = f"{len(p.calibration_rows) - n_moe}" + (f" + {n_moe} MoE" if n_moe else "")
        lines.append(f"| `{key}` | {p.kernel_family}, {p.attention_kernel} | {p.tp_overlap:g} | {p.cp_comm} | "
                     f"{'hierarchical' if p.hierarchical else 'flat'} | " + " | ".join(cells) + f" | {rows} |")
    return lines


def test_docs_profile_table_is_the_code():
    """The profile table in docs/planner.md is what stacks.PROFILES holds now (it had drifted from the fits
    before this test: NeMo 24.07, the 2025 Megatron-Core profile and Llama 3 read older constants), and the
    sentence under it quotes the fitted MoE term."""
    assert documented("profile-table", ("| `",)) == _profile_table_lines()
    moe_us = PROFILES["megatron-core-te/2025"].fitted["shared"]["moe_layer_us"]
    assert f"`moe_layer_us` {moe_us:,.0f} us" in " ".join(DOCS.read_text().split())
