"""Mixture-of-experts in the planner: presets, active-parameter MFU, grouped-GEMM efficiency, expert
parallelism (all-to-all over the topology, expert states), the search and the CLI, and the MoE held-out
figures that docs/planner.md states."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from _planner_docs import documented, summary_lines

from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner import PlanConfig, Training, make_cluster, plan
from wavefront.workbench.planner.kernels import gemm_s, grouped_gemm_s
from wavefront.workbench.planner.memory import memory_breakdown
from wavefront.workbench.planner.model import layer_activation_bytes
from wavefront.workbench.planner.moe import MOE_MODELS
from wavefront.workbench.planner.recipes import recipe_for
from wavefront.workbench.planner.search import _as_model, evaluate
from wavefront.workbench.planner.time import ep_comm_per_layer_s, step_time
from wavefront.workbench.planner.training import Efficiency
from wavefront.workbench.planner.validation import (
    MOE_REPORT_TABLES,
    load_table,
    predict_row,
    recipe_facts,
    report_tables,
    split_of,
    validate,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "published"
TRAIN = Training(global_batch_tokens=256 * 4096, seq_len=4096)


@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    ("mixtral-8x7b", 46.7, 12.9),  # Mistral AI's model card: 46.7B total, 12.9B active
    ("qwen3-30b-a3b", 30.5, 3.3),  # Qwen3 report Table 2: 30B total, 3B activated (model card: 30.5B / 3.3B)
    ("qwen3-235b-a22b", 235.0, 22.0),  # model card: 235B total, 22B activated
    ("deepseek-v3", 671.0, 37.0),  # DeepSeek-V3 report: 671B total, 37B activated (MTP module excluded)
])
def test_presets_reproduce_published_total_and_active_parameters(name, total_b, active_b):
    model = _as_model(name)
    assert model.total_params / 1e9 == pytest.approx(total_b, rel=0.015)
    assert model.active_params / 1e9 == pytest.approx(active_b, rel=0.03)


def test_mfu_counts_active_parameters():
    model = _as_model("qwen3-30b-a3b")
    dims = model.dims
    matmul_active = model.active_params - model.embedding_params  # untied: the input table is a lookup
    attention = 12.0 * dims.n_layers * dims.n_heads * dims.head_dim * 4096
    assert model.model_flops_per_token(4096) == pytest.approx(6.0 * matmul_active + attention)
    assert model.model_flops_per_token(4096) < 0.2 * 6.0 * model.total_params  # far below total-parameter FLOPs
    res = evaluate(model, PlanConfig(dp=8, ep=8, zero=1), TRAIN, make_cluster("8xh100"))
    kpis = res.kpis
    assert kpis is not None
    assert kpis.mfu == pytest.approx(kpis.tokens_per_s_per_gpu * model.model_flops_per_token(4096)
                                     / (get_gpu("h100").peak_tflops("bf16") * 1e12))


def test_grouped_gemm_is_the_gemm_model_for_one_group_and_loses_efficiency_with_few_tokens_per_expert():
    gpu = get_gpu("h100")
    peak, hbm = 700e12, 3.0e12
    assert grouped_gemm_s(gpu, 1, 4096, 4096, 4096, peak, hbm, 2.0, 0.0) == pytest.approx(
        gemm_s(gpu, 4096, 4096, 4096, peak, hbm, 2.0, 0.0))

    def achieved(tokens_per_expert: float, groups: int = 16) -> float:
        flops = 2.0 * groups * tokens_per_expert * 1536 * 2048
        return flops / grouped_gemm_s(gpu, groups, tokens_per_expert, 1536, 2048, peak, hbm, 2.0, 0.0)

    # tokens per expert = tokens * top_k / E: fewer tokens per expert -> weight-bound, tile-padded GEMMs
    assert achieved(4096) > achieved(256) > achieved(40)
    assert achieved(40) < 0.3 * achieved(4096)


def test_expert_all_to_all_prices_the_topology_top_k_and_imbalance():
    model = _as_model("deepseek-v3")
    cluster = make_cluster("64xh100")
    cfg = PlanConfig(dp=64, ep=8, zero=1)
    intra = ep_comm_per_layer_s(model, cfg, TRAIN, cluster)
    inter = ep_comm_per_layer_s(model, replace(cfg, ep=32), TRAIN, cluster)
    assert 0 < intra < inter  # ep 8 stays on NVLink; ep 32 sends 3/4 of its tokens over the NICs
    assert ep_comm_per_layer_s(model, replace(cfg, ep=1), TRAIN, cluster) == 0.0
    skewed = replace(TRAIN, moe_imbalance=1.5)
    assert ep_comm_per_layer_s(model, cfg, skewed, cluster) > intra
    hidden = replace(TRAIN, ep_overlap=0.5)
    assert ep_comm_per_layer_s(model, cfg, hidden, cluster) == pytest.approx(0.5 * intra)


def test_imbalance_slows_the_step_and_grows_activations():
    model = _as_model("qwen3-30b-a3b")
    cluster = make_cluster("8xh100")
    cfg = PlanConfig(dp=8, ep=8, zero=1)
    eff = Efficiency.for_gpu("h100")
    skewed = replace(TRAIN, moe_imbalance=2.0)
    assert step_time(model, cfg, skewed, cluster, eff).step_s > 1.2 * step_time(model, cfg, TRAIN, cluster, eff).step_s
    assert (memory_breakdown(model, cfg, skewed, cluster).activations_bytes
            > memory_breakdown(model, cfg, TRAIN, cluster).activations_bytes)


def test_expert_weights_split_over_ep_and_their_states_over_the_expert_data_parallel_group():
    model = _as_model("mixtral-8x7b")
    cluster = make_cluster("16xh100")
    mems = {ep: memory_breakdown(model, PlanConfig(dp=16, ep=ep, zero=1), TRAIN, cluster) for ep in (1, 2, 8)}
    assert mems[1].params_bytes > mems[2].params_bytes > mems[8].params_bytes
    expert_bytes = model.n_moe_layers * model.moe.n_experts * model.expert_params * 2  # bf16, ep 1
    assert mems[1].params_bytes - mems[8].params_bytes == pytest.approx(expert_bytes * 7 / 8, rel=1e-9)
    # ZeRO-1 (AdamW: 12 B of master + moments per parameter): everything sharded over the 16 data-parallel
    # ranks at ep 1; at ep 8 the experts' states over their 16 / 8 = 2 expert-data-parallel ranks
    experts = model.n_moe_layers * model.moe.n_experts * model.expert_params
    assert mems[1].optimizer_bytes == pytest.approx(model.total_params * 12.0 / 16, rel=1e-9)
    assert mems[8].optimizer_bytes == pytest.approx((model.total_params - experts) * 12.0 / 16
                                                    + experts / 8 * 12.0 / 2, rel=1e-9)


def test_structural_rules_for_expert_parallelism():
    model = _as_model("qwen3-30b-a3b")
    cluster = make_cluster("16xh100")
    bad = evaluate(model, PlanConfig(dp=16, ep=3), TRAIN, cluster)
    assert any("does not divide 128 experts" in r for r in bad.reasons)
    bad = evaluate(model, PlanConfig(tp=2, sp=False, dp=8, ep=8), TRAIN, cluster)
    assert any("needs sequence parallel" in r for r in bad.reasons)
    dense = evaluate(_as_model("llama3-8b"), PlanConfig(dp=16, ep=2), TRAIN, cluster)
    assert any("needs a mixture-of-experts model" in r for r in dense.reasons)


def test_search_ranks_expert_parallel_plans_and_pins_ep():
    # the whole device admitted: which EP degrees are searched, not the default headroom, is under test
    result = plan("qwen3-30b-a3b", "8xh100", replace(TRAIN, memory_headroom=1.0), fixed={"pp": 1, "tp": 1, "cp": 1})
    assert result.best is not None
    assert {r.config.ep for r in result.ranked} >= {1, 2, 8}
    pinned = plan("qwen3-30b-a3b", "8xh100", TRAIN, fixed={"ep": 4, "pp": 1, "tp": 1})
    assert pinned.ranked and all(r.config.ep == 4 for r in pinned.ranked)
    missing = plan("qwen3-30b-a3b", "8xh100", TRAIN, fixed={"ep": 3})
    assert not missing.ranked
    assert any("ep=3" in line and "expert-parallel degrees" in line for line in missing.explain())
    doc = result.as_dict()
    assert doc["model"]["moe"]["n_experts"] == 128 and doc["model"]["active_params"] < doc["model"]["params"]


def test_cli_prices_a_moe_preset_with_ep_pinned(tmp_path):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    out = tmp_path / "plan.json"
    res = CliRunner().invoke(build_app(), ["plan", "--model", "mixtral-8x7b", "--gpus", "16xh100", "--seq-len", "4096",
                                   "--ep", "8", "--fix", "pp=1", "--fix", "tp=1", "--top", "3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["plans"] and all(p["config"]["ep"] == 8 for p in doc["plans"])
    assert "MFU counts active parameters" in " ".join(res.output.split())
    res = CliRunner().invoke(build_app(), ["plan", "--model", "mixtral-8x7b", "--gpus", "16xh100", "--ep", "8",
                                   "--fix", "ep=4"])
    assert res.exit_code == 2 and "contradicts" in res.output
    res = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-8b", "--gpus", "8xh100", "--ep", "2"])
    assert res.exit_code == 1 and "needs a mixture-of-experts model" in " ".join(res.output.split())


def test_moe_tables_split_by_the_hash_rule_and_docs_state_their_held_out_figures():
    for rel in MOE_REPORT_TABLES:
        doc = load_table(DATA / rel)
        assert doc["source"]["url"].startswith("https://") and doc.get("assumed")
        for row in doc["rows"]:
            assert row["split"] == split_of(doc["name"], str(row["id"]))
            assert MOE_MODELS.get(row["model"]) is not None
    assert documented("moe-accuracy-table") == summary_lines(report_tables(DATA, tables=MOE_REPORT_TABLES))


def _hf_config(tmp_path: Path, name: str, cfg: dict) -> str:
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return str(path)


def test_hugging_face_moe_configs_give_the_presets_parameters(tmp_path):
    from wavefront.workbench.planner import PlanRequest

    deepseek = _hf_config(tmp_path, "dsv3", {
        "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "max_position_embeddings": 163840, "tie_word_embeddings": False, "n_group": 8,
        "topk_group": 4})
    mixtral = _hf_config(tmp_path, "mixtral", {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
        "num_experts_per_tok": 2, "max_position_embeddings": 32768})
    for path, preset in ((deepseek, "deepseek-v3"), (mixtral, "mixtral-8x7b")):
        spec = PlanRequest(model=path).model_spec()
        want = _as_model(preset)
        assert spec.moe == want.moe and spec.mla == want.mla
        assert spec.total_params == want.total_params and spec.active_params == want.active_params


def test_a_moe_search_of_10k_plus_plans_ranks_in_under_2_s_cpu():
    import time

    plan("qwen3-30b-a3b", "8xh100", TRAIN)  # warm the per-process caches, as test_planner_search does
    cpu = time.process_time()
    result = plan("mixtral-8x7b", "16xh100", Training(global_batch_tokens=4 * 2**20, seq_len=4096))
    cpu_s = time.process_time() - cpu
    print(f"\n[benchmark] planner MoE: {result.n_enumerated:,} plans in {cpu_s:.2f} s CPU")
    assert result.n_enumerated > 10_000 and len({r.config.ep for r in result.ranked}) > 1
    assert cpu_s < 2.0


def test_fp8_moe_layers_are_priced_with_their_casts():
    """The expert GEMMs follow the dense FP8 rule: fp8 peak x fp8_gemm plus cast kernels (Transformer
    Engine's fused casts under Megatron, separate ones under FSDP stacks), so fp8 speeds a MoE layer up by
    less than the 2x peak ratio, and less under the FSDP stack."""
    from wavefront.workbench.planner.time import layer_compute_s

    model = _as_model("qwen3-30b-a3b")
    cluster = make_cluster("8xh100")
    cfg = PlanConfig(dp=8, ep=8, zero=1, micro_batch=2)
    eff = Efficiency.for_gpu("h100")
    t = {(p, st): layer_compute_s(model, cfg, replace(TRAIN, precision=p, stack=st), cluster, eff, True)[0]
         for p in ("bf16", "fp8") for st in ("megatron", "fsdp")}
    assert 1.0 < t["bf16", "megatron"] / t["fp8", "megatron"] < 2.0
    fsdp_eff = replace(eff, fsdp_stack=1.0)  # same GEMM speed: only the casts differ
    fsdp = layer_compute_s(model, cfg, replace(TRAIN, precision="fp8", stack="fsdp"), cluster, fsdp_eff, True)[0]
    assert fsdp > t["fp8", "megatron"]


def test_all_to_all_across_nodes_sends_each_ranks_remote_share_through_its_own_nic():
    cluster = make_cluster("32xh100")
    size = 64e6
    lat = cluster.inter.latency_us * 1e-6
    intra_bw, inter_bw = cluster.intra.busbw_gbps * 1e9, cluster.inter.busbw_gbps * 1e9
    # 16 ranks on 2 nodes: 7/16 of the bytes over NVLink and 8/16 over the NIC, at the same time
    assert cluster.all_to_all_s(size, 16) == pytest.approx(lat + max(7 / 16 * size / intra_bw,
                                                                     8 / 16 * size / inter_bw))
    # inside a node: the nccl-tests all_to_all on the scale-up link
    assert cluster.all_to_all_s(size, 8) == pytest.approx(cluster.intra.time_s("all_to_all", size, 8))
    # unlike a reduce-scatter, nothing shrinks by the 8 GPUs of a node: the NICs carry the remote share
    assert cluster.all_to_all_s(size, 32) > 3 * cluster.collective_s("reduce_scatter", size, 32, 1)


def test_deepep_sends_a_token_once_per_node_and_node_limited_routing_caps_the_nodes():
    """DeepEP's normal kernels (DeepSeek-V3 report, Sec. 3.2.2): a token crosses to each node holding one of
    its experts once, and DeepSeek-V3 routes each token to at most 4 of 8 expert groups: over 8 nodes
    (ep64) it reaches 8 (1 - C(7,4)/C(8,4)) = 4 nodes, 3.5 of them other nodes, where the plain all-to-all
    moves 7 of its 8 copies across nodes. Inside one node nothing changes."""
    dsv3, qwen = MOE_MODELS["deepseek-v3"].moe, MOE_MODELS["qwen3-235b-a22b"].moe
    assert dsv3.remote_nodes_per_token(8) == pytest.approx(3.5)
    assert dsv3.remote_nodes_per_token(1) == 0.0
    assert qwen.remote_nodes_per_token(4) == pytest.approx(4 * (1 - 0.75 ** 8) * 0.75)
    spec, cluster = _as_model("deepseek-v3"), make_cluster("256xh100")
    cfg = PlanConfig(dp=64, pp=4, ep=64)
    plain = Training(global_batch_tokens=512 * 4096, seq_len=4096)
    deepep = replace(plain, ep_dispatch="deepep")
    a2a, dedup = (ep_comm_per_layer_s(spec, cfg, t, cluster) for t in (plain, deepep))
    assert 0.45 < dedup / a2a < 0.55  # inter-node bound: 3.5 of 7 copies
    small = PlanConfig(dp=8, ep=8)
    assert ep_comm_per_layer_s(spec, small, deepep, make_cluster("8xh100")) == ep_comm_per_layer_s(
        spec, small, plain, make_cluster("8xh100"))
    with pytest.raises(ValueError, match="ep_dispatch"):
        Training(global_batch_tokens=4096, seq_len=4096, ep_dispatch="nvshmem")


def test_recipe_facts_come_from_the_config_with_the_rows_exact_plan():
    """A Megatron-Bridge row takes its config's dispatcher and overlap only when every plan field matches
    (recipes.py); a fact the row states wins; the default profile (no stack stated) takes none."""
    doc = load_table(DATA / "validation" / "megatron_bridge_2602_2606_moe.json")
    by_id = {r["id"]: r for r in doc["rows"]}
    ds = by_id["26.04.01 b200 deepseek-v3 256gpu tp1 pp8 cp1 vp2 ep32 mb1"]
    assert recipe_facts(doc, ds) == {"ep_dispatch": "deepep", "ep_overlap": 1.0, "recompute": "selective",
                                     "recompute_modules": ("mla_up_proj", "mlp")}
    assert recipe_for({**doc["defaults"], **ds}).config.startswith("DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2")
    h100 = by_id["26.04 h100 qwen3-235b-a22b 256gpu tp2 pp8 cp1 vp4 ep32 mb1"]
    assert recipe_facts(doc, h100) == {"ep_dispatch": "all-to-all", "ep_overlap": 1.0}
    assert recipe_facts(doc, h100 | {"global_batch": 4096}) == {}  # no config with that batch
    assert recipe_facts(doc, by_id["26.02.01 h100 qwen3-30b-a3b 16gpu tp1 pp2 cp1 vp12 ep8 mb1"]) == {}
    stated = validate(doc, rows=lambda r: r is ds).rows[0].predicted
    own = doc | {"rows": [ds | {"ep_overlap": 0.0}]}
    assert validate(own).rows[0].predicted < stated  # the row's own fact (no overlap) wins: slower
    plain = doc | {"defaults": {k: v for k, v in doc["defaults"].items() if k != "recipes"}, "rows": [ds]}
    assert validate(plain).rows[0].predicted < stated
    # no stack stated: the recipe's checkpointing stays (it is the plan's), its dispatcher and overlap go
    plan_only = plain | {"rows": [ds | {"recompute": "selective", "recompute_modules": ["mla_up_proj", "mlp"]}]}
    assert validate(doc | {"rows": [ds]}, stated=False).rows[0].predicted == validate(
        plan_only, stated=False).rows[0].predicted


def test_ep_overlap_hides_no_more_than_the_paired_compute():
    """Overlapped all-to-alls hide behind another micro-batch's compute, at most that compute: the forward's
    half under two thirds of the layer seconds (its backward), the backward's under one third."""
    spec, cluster = _as_model("deepseek-v3"), make_cluster("256xb200")
    cfg, t = PlanConfig(dp=32, pp=8, ep=32), Training(global_batch_tokens=4096 * 4096, seq_len=4096)
    total = ep_comm_per_layer_s(spec, cfg, t, cluster)
    hidden = replace(t, ep_overlap=1.0)
    assert ep_comm_per_layer_s(spec, cfg, hidden, cluster) == 0.0  # no bound given: hidden whole
    assert ep_comm_per_layer_s(spec, cfg, hidden, cluster, layer_s=1e3) == 0.0  # ample compute
    short = 0.3 * total
    exposed = ep_comm_per_layer_s(spec, cfg, hidden, cluster, layer_s=short)
    assert exposed == pytest.approx(max(0.0, total / 2 - 2 * short / 3) + max(0.0, total / 2 - short / 3))
    assert 0.0 < exposed < total
    half = ep_comm_per_layer_s(spec, cfg, replace(t, ep_overlap=0.5), cluster, layer_s=short)
    assert half == pytest.approx(0.5 * total + max(0.0, total / 4 - 2 * short / 3) + max(0.0, total / 4 - short / 3))


def test_plan_states_the_dispatcher_from_the_command_line(tmp_path):
    """`--ep-dispatch deepep` prices the cross-node all-to-all as DeepEP / HybridEP send it (once per node)."""
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    app, out = build_app(), tmp_path / "plan.json"
    args = ["plan", "--model", "deepseek-v3", "--gpus", "256xb200", "--precision", "fp8", "--seq-len", "4096",
            "--fix", "tp=1", "--fix", "pp=8", "--fix", "vpp=2", "--ep", "32", "--fix", "micro_batch=1",
            "--fix", "recompute=none", "--top", "1"]
    times = {}
    for dispatch in ("all-to-all", "deepep"):
        res = CliRunner().invoke(app, args + ["--ep-dispatch", dispatch, "--json", str(out)])
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        times[dispatch] = doc["plans"][0]["time"]["ep_comm_s"]
    assert 0.0 < times["deepep"] < times["all-to-all"]
    bad = CliRunner().invoke(app, args + ["--ep-dispatch", "nvshmem"])
    assert bad.exit_code == 2 and "--ep-dispatch" in bad.output
    # the recipe's recompute modules, pinned with --fix: the MLA up-projections rerun, their outputs freed
    sel = args[:-4] + ["--fix", "recompute=selective", "--fix", "cp=1", "--fix", "zero=1", "--top", "1", "--json",
                       str(out)]
    mems = {}
    for modules in ("core_attn", "core_attn,mla_up_proj"):
        res = CliRunner().invoke(app, sel + ["--fix", f"recompute_modules={modules}"])
        assert res.exit_code in (0, 1), res.output  # 1: the plan is out of memory (its closest is reported)
        doc = json.loads(out.read_text())
        mems[modules] = (doc["plans"] or doc["closest_out_of_memory"])[0]["memory"]["activations_bytes"]
    assert mems["core_attn,mla_up_proj"] < 0.8 * mems["core_attn"]
    bad = CliRunner().invoke(app, args + ["--fix", "recompute_modules=layernorm"])
    assert bad.exit_code == 2 and "--fix recompute_modules" in bad.output


def test_recompute_modules_free_what_megatron_frees_and_rerun_what_it_reruns():
    """recompute="selective" with Megatron-Core's recompute modules: mla_up_proj frees the MLA queries, keys and
    values (2 B x (q_dim + 2 kv_dim) per token and layer) and reruns the two up-projections; mlp frees a dense
    layer's MLP terms and leaves a MoE layer's alone; moe_act frees the experts' activation output per routed
    row; core_attn alone is the old selective policy."""
    spec = _as_model("deepseek-v3")
    kw = dict(seq_len=4096, micro_batch=1, tp=1, sp=False, fp8=True)
    sel = layer_activation_bytes(spec, recompute="selective", **kw)
    assert sel == layer_activation_bytes(spec, recompute="none", **kw)  # flash attention: nothing dropped
    up = layer_activation_bytes(spec, recompute="selective", modules=("mla_up_proj",), **kw)
    assert sel - up == pytest.approx(4096 * (2 * spec.q_dim + 4 * spec.kv_dim))
    dense_mlp = layer_activation_bytes(spec, recompute="selective", modules=("mlp",), **kw)
    assert sel - dense_mlp == pytest.approx((4 + 1) * 4096 * spec.dims.ffn_hidden)  # gate/up bf16, down input fp8
    rows = 4096 * 8.0
    moe_kw = kw | {"routed_rows": rows}
    moe_sel = layer_activation_bytes(spec, recompute="selective", **moe_kw)
    assert layer_activation_bytes(spec, recompute="selective", modules=("mlp",), **moe_kw) == moe_sel
    act = layer_activation_bytes(spec, recompute="selective", modules=("moe_act",), **moe_kw)
    assert moe_sel - act == pytest.approx(rows * spec.moe.expert_ffn)  # the fp8 down-projection input
    with pytest.raises(ValueError, match="recompute_modules"):
        Training(global_batch_tokens=4096, seq_len=4096, recompute_modules=("layernorm",))
    # time: the modules rerun their forward; HFU counts their matmul FLOPs
    cluster, cfg = make_cluster("8xb200"), PlanConfig(dp=8, ep=8, recompute="selective")
    base = Training(global_batch_tokens=64 * 4096, seq_len=4096, precision="fp8")
    t_core = evaluate(spec, cfg, base, cluster)
    t_up = evaluate(spec, cfg, replace(base, recompute_modules=("core_attn", "mla_up_proj")), cluster)
    t_none = evaluate(spec, replace(cfg, recompute="none"), base, cluster)
    assert t_none.time.step_s < t_core.time.step_s < t_up.time.step_s
    q_b, kv_b = spec.mla.linear_shapes(spec.dims.hidden, spec.dims.n_heads)[1::2]
    extra = spec.hardware_flops_per_token(4096, "selective", ("core_attn", "mla_up_proj")) - \
        spec.hardware_flops_per_token(4096, "selective")
    assert extra == pytest.approx(2.0 * spec.dims.n_layers * (q_b[0] * q_b[1] + kv_b[0] * kv_b[1]))


def test_the_recipe_recompute_modules_make_the_b200_deepseek_plan_fit():
    """Megatron-Bridge 26.04.01's DeepSeek-V3 on 256 B200 (pp8 vp2 ep32) ran with recompute_modules
    mla_up_proj and mlp (its config, recipes.py): priced with no recomputation it was 207.1 GB of 191.5;
    with the config's modules it fits, and the row's own "recompute" would win over the config's."""
    doc = load_table(DATA / "validation" / "megatron_bridge_2602_2606_moe.json")
    row = next(r for r in doc["rows"] if r["id"].startswith("26.04.01 b200 deepseek-v3"))
    mem = predict_row(doc, row).memory
    assert predict_row(doc, row).config.recompute == "selective" and mem.fits_device
    assert mem.total_bytes < 0.9 * mem.capacity_bytes
    stated_none = predict_row(doc, row | {"recompute": "none"})
    assert stated_none.config.recompute == "none" and not stated_none.memory.fits_device
