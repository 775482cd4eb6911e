"""The defects of issue #18, each with the case that showed it, and the new inputs: topology, FP8 casts,
checkpointing policies, uneven stages, Hugging Face configs, terminal tables that never cut numbers."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.shapes import get_model
from wavefront.workbench.planner import Efficiency, PlanConfig, PlanRequest, Training, evaluate, make_cluster, plan
from wavefront.workbench.planner.memory import memory_breakdown
from wavefront.workbench.planner.model import ModelSpec, layer_activation_bytes
from wavefront.workbench.planner.time import layer_compute_s

LLAMA8 = ModelSpec(get_model("llama3-8b"))
LLAMA70 = ModelSpec(get_model("llama3-70b"))


def test_a_rejected_but_real_plan_now_fits():
    """Llama 3 70B on 64 H100 in FP8 at tp4 pp8 vp5 without recomputation ran on 80 GB (Megatron-Bridge
    25.11); the planner said 86.4 GB. FP8 linear inputs are kept in 1 byte, as Transformer Engine does."""
    cfg = PlanConfig(tp=4, sp=True, pp=8, vpp=5, dp=2, zero=1, recompute="none", micro_batch=1)
    res = evaluate(LLAMA70, cfg, Training(global_batch_tokens=128 * 8192, seq_len=8192, precision="fp8"),
                   make_cluster("64xh100"))
    assert res.memory.fits_device, res.reasons  # it ran on the device (the search's headroom is a margin)
    assert res.memory.total_bytes < 80e9
    bf16 = evaluate(LLAMA70, cfg, Training(global_batch_tokens=128 * 8192, seq_len=8192), make_cluster("64xh100"))
    assert bf16.memory.activations_bytes > res.memory.activations_bytes


def test_an_fp8_run_is_priced_with_its_casts():
    """FP8 GEMMs at a fraction of the fp8 peak plus cast/amax/transpose kernels: the speed-up over bf16
    lands in the published 1.0-1.35x range, not at the 2x of the peaks; unfused casts (FSDP stacks) cost
    more than Transformer Engine's fused ones."""
    cluster = make_cluster("8xh100")
    cfg = PlanConfig(dp=8, zero=1, recompute="none", micro_batch=1)
    t = {}
    for precision in ("bf16", "fp8"):
        for stack in ("megatron", "fsdp"):
            training = Training(global_batch_tokens=64 * 8192, seq_len=8192, precision=precision, stack=stack)
            t[precision, stack] = layer_compute_s(LLAMA8, cfg, training, cluster,
                                                  Efficiency.for_gpu("h100"))[0]
    for stack in ("megatron", "fsdp"):
        assert 1.0 < t["bf16", stack] / t["fp8", stack] < 1.35
    # the same fp8 GEMMs; the FSDP stack's separate cast kernels add bytes on top
    from wavefront.workbench.planner.kernels import FP8_CAST_BYTES_PER_ACT, FP8_FUSED_CAST_BYTES_PER_ACT

    assert FP8_CAST_BYTES_PER_ACT > FP8_FUSED_CAST_BYTES_PER_ACT
    fsdp = Training(global_batch_tokens=64 * 8192, seq_len=8192, precision="fp8", stack="fsdp")
    meg = Training(global_batch_tokens=64 * 8192, seq_len=8192, precision="fp8", stack="megatron")
    eff = Efficiency(gemm=0.7, attention=0.3)
    assert layer_compute_s(LLAMA8, cfg, fsdp, cluster, eff)[0] > layer_compute_s(LLAMA8, cfg, meg, cluster, eff)[0]


def test_8b_on_8_gpus_no_longer_ties_eight_ways():
    result = plan("llama3-8b", "8xh100")
    best = result.best.config
    assert best.cp == 1 and best.tp == 1 and best.pp == 1 and best.dp == 8  # plain data parallelism wins
    steps = [r.time.step_s for r in result.ranked[:8]]
    assert len(set(round(s, 6) for s in steps)) > 1
    # micro-batch sizes no longer tie: the GEMM shapes and the attention curve tell them apart
    times = {mb: layer_compute_s(LLAMA8, PlanConfig(dp=8, micro_batch=mb), Training(global_batch_tokens=64 * 2048,
                                                                                    seq_len=2048),
                                 make_cluster("8xh100"), Efficiency.for_gpu("h100"))[0] / mb for mb in (1, 2, 4)}
    assert len(set(round(v, 9) for v in times.values())) == 3


def test_small_models_run_at_a_lower_fraction_of_peak_than_large_ones():
    cluster = make_cluster("8xh100")
    training = Training(global_batch_tokens=64 * 2048, seq_len=2048)
    eff = Efficiency.for_gpu("h100")
    small = ModelSpec(get_model("megatron-gpt-1.7b"))
    rates = []
    for model in (small, LLAMA70):
        t, _ = layer_compute_s(model, PlanConfig(dp=8), training, cluster, eff)
        rates.append(6 * 2048 * model.layer_matmul_params / t)
    assert rates[0] < 0.9 * rates[1]


def test_long_sequences_pay_for_attention_and_context_parallel_chunks():
    eff = Efficiency.for_gpu("h100")
    from wavefront.workbench.planner.kernels import attention_curve

    assert attention_curve(512, 128) < attention_curve(4096, 128) < attention_curve(65536, 128)
    assert attention_curve(8192, 64) < attention_curve(8192, 128) < attention_curve(8192, 256)
    cluster = make_cluster("8xh100")
    long = Training(global_batch_tokens=8 * 65536, seq_len=65536)
    _, attn1 = layer_compute_s(LLAMA8, PlanConfig(dp=8), long, cluster, eff)
    _, attn8 = layer_compute_s(LLAMA8, PlanConfig(cp=8, dp=1), long, cluster, eff)
    assert attn8 * 8 > attn1  # each ring step is a shorter, less efficient kernel


def test_hierarchical_collectives_across_nodes():
    """A data-parallel group with 8 members per node moves S/8 per member across nodes on its own NIC;
    flat collectives (one NIC for the whole buffer) are 8x slower across nodes."""
    hier = make_cluster("16xh100", intra_latency_us=0, inter_latency_us=0)
    flat = make_cluster("16xh100", intra_latency_us=0, inter_latency_us=0, hierarchical=False)
    size = 1e9
    expected = (hier.intra.time_s("all_reduce", size, 8) + hier.inter.time_s("all_reduce", size / 8, 2))
    assert hier.collective_s("all_reduce", size, 16, 1) == pytest.approx(expected)
    assert flat.collective_s("all_reduce", size, 16, 1) == pytest.approx(hier.inter.time_s("all_reduce", size, 16))
    assert flat.collective_s("all_reduce", size, 16, 1) > 4 * hier.collective_s("all_reduce", size, 16, 1)
    # one member per node (stride of a whole node): the flat inter-node collective
    assert hier.collective_s("all_reduce", size, 2, 8) == pytest.approx(hier.inter.time_s("all_reduce", size, 2))
    # fewer NICs than GPUs share them
    shared = make_cluster("16xh100", nics_per_node=2)
    assert shared.inter.busbw_gbps == pytest.approx(hier.inter.busbw_gbps / 4)


def test_checkpointing_policies_and_fsdp_variants_change_memory():
    kw = dict(seq_len=8192, micro_batch=1, tp=1, sp=False)
    mem = {rc: layer_activation_bytes(LLAMA8, recompute=rc, **kw) for rc in
           ("none", "op", "selective", "every-other", "full")}
    assert mem["full"] < mem["every-other"] < mem["none"]
    assert mem["every-other"] == pytest.approx((mem["none"] + mem["full"]) / 2)
    assert mem["op"] < mem["none"]  # per-op: matmul outputs saved, elementwise recomputed
    cluster = make_cluster("16xh100")
    cfg = PlanConfig(dp=16, zero=3, recompute="full", micro_batch=1)
    train = {g: Training(global_batch_tokens=64 * 8192, seq_len=8192, fsdp_gather=g)
             for g in ("micro-batch", "no-reshard", "step")}
    totals = {g: memory_breakdown(LLAMA8, cfg, t, cluster).total_bytes for g, t in train.items()}
    assert totals["micro-batch"] < totals["no-reshard"] < totals["step"]
    hsdp = memory_breakdown(LLAMA8, PlanConfig(dp=16, zero=3, recompute="full", shard=8), train["micro-batch"],
                            cluster)
    assert hsdp.optimizer_bytes == pytest.approx(2 * memory_breakdown(LLAMA8, cfg, train["micro-batch"],
                                                                      cluster).optimizer_bytes)
    off = memory_breakdown(LLAMA8, cfg, Training(global_batch_tokens=64 * 8192, seq_len=8192,
                                                 offload_optimizer=True), cluster)
    assert off.optimizer_bytes == 0.0


def test_uneven_pipeline_and_vpp_5_from_the_cli(tmp_path):
    out = tmp_path / "plan.json"
    args = ["plan", "--model", "llama3-405b", "--gpus", "2048xh100", "--fix", "pp=16", "--fix", "tp=8",
            "--fix", "recompute=full", "--top", "1", "--json", str(out)]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    best = json.loads(out.read_text())["plans"][0]["config"]
    assert best["pp"] == 16 and 126 % 16  # 126 layers on 16 stages: uneven
    args = ["plan", "--model", "llama3-70b", "--gpus", "64xh100", "--precision", "fp8", "--fix", "tp=4",
            "--fix", "pp=8", "--fix", "vpp=5", "--top", "1", "--json", str(out)]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["plans"][0]["config"]["vpp"] == 5


def test_tiny_batch_warning_and_seq_len_zero():
    result = plan(PlanRequest(model="llama3-405b", gpus=("16384xh100",), fixed={"tp": 8, "pp": 16}))
    assert any("512 sequences for 16,384 GPUs" in w for w in result.warnings)
    with pytest.raises(ValueError, match="--seq-len must be >= 1"):
        plan(PlanRequest(model="llama3-8b", seq_len=0))
    cli = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-8b", "--seq-len", "0"])
    assert cli.exit_code == 2 and "Traceback" not in cli.output


def test_hugging_face_config_and_head_dim(tmp_path):
    cfg = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
           "max_position_embeddings": 8192, "tie_word_embeddings": True, "_name_or_path": "google/gemma-2-9b"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = PlanRequest(model=str(path)).model_spec()
    assert spec.dims.head_dim == 256 and spec.q_dim == 4096 and spec.dims.gated_mlp and spec.dims.tied_embeddings
    assert PlanRequest(model="llama3-8b", head_dim=64).model_spec().q_dim == 32 * 64
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 10}))
    with pytest.raises(ValueError, match="config.json lacks num_attention_heads"):
        PlanRequest(model=str(bad)).model_spec()


@pytest.mark.parametrize("columns", ["80", "120"])
def test_plan_tables_never_cut_numbers(columns, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    result = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-70b", "--gpus", "64xh100", "--top", "5",
                                              "--fix", "tp=8"])
    assert result.exit_code == 0, result.output
    assert "\u2026" not in result.output  # rich's ellipsis: nothing truncated
    doc = plan(PlanRequest(model="llama3-70b", gpus=("64xh100",), top=5, fixed={"tp": 8})).as_dict()
    flat = re.sub(r"\s+", "", result.output)
    for p in doc["plans"]:
        assert re.sub(r"\s+", "", p["config"]["label"]) in flat
        assert f"{p['time']['step_s']:.2f}" in result.output


def test_70b_on_64_h100_ranks_what_people_run_not_context_parallelism_at_8k():
    """Defect 7: every top-20 plan used CP at 8K and torchtitan's TP8 + FSDP ranked ~997th, because TP
    communication was fully exposed by default and CP's ring cost nothing. TP overlap is now a fact of the
    stack profile (0.5 for Megatron-Core + Transformer Engine, training.TP_OVERLAP) and CP pays for its
    s/(2 cp) chunks and merges: on that stack the best plans are TP4 with FSDP or a pipeline (Megatron-Bridge
    25.11 runs tp4 pp8), and CP is at most 2 among the top 10, most of which use none. CP2 at 8K within 1%
    of the best is not the defect: with the device's capacity as CUDA reports it (85.0 GB) TP2 PP4 CP2 fits,
    and NeMo's own Llama 3 70B pretraining recipe at 8K tokens is TP4 PP4 VP5 CP2 (NeMo 2.0,
    nemo/collections/llm/recipes/llama3_70b.py, trainer()). CP ranks first where memory forces it (long
    sequences). On a stack without TP overlap (wavefront-train, torchtitan) CP2 does rank first at 8K:
    its TP collectives are all exposed (docs/planner.md)."""
    result = plan(PlanRequest(model="llama3-70b", gpus=("64xh100",), stack="megatron-core-te/2025"))
    assert result.best.config.cp == 1
    top = [r.config for r in result.ranked[:10]]
    assert all(c.cp <= 2 for c in top) and sum(c.cp == 1 for c in top) > len(top) // 2
    assert all(c.tp in (4, 8) and (c.zero == 3 or c.pp > 1) for c in top if c.cp == 1)
    tp8_fsdp = next(r for r in result.ranked if r.config.tp == 8 and r.config.zero == 3 and r.config.pp == 1)
    exposed = evaluate(LLAMA70, tp8_fsdp.config, replace(result.training, tp_overlap=0.0), make_cluster("64xh100"),
                       result.efficiency)
    assert tp8_fsdp.time.tp_comm_s == pytest.approx(0.5 * exposed.time.tp_comm_s)
    plain = plan(PlanRequest(model="llama3-70b", gpus=("64xh100",)))
    assert plain.training.tp_overlap == 0.0 and plain.best.config.cp > 1
    long = plan("llama3-8b", "8xh100", Training(global_batch_tokens=2**20, seq_len=131072))
    assert long.best.config.cp > 1


def test_context_parallel_attention_runs_on_chunks_of_s_over_2cp_and_pays_its_merges():
    cluster, eff = make_cluster("8xh100"), Efficiency.for_gpu("h100")
    training = Training(global_batch_tokens=64 * 8192, seq_len=8192)
    _, attn1 = layer_compute_s(LLAMA8, PlanConfig(dp=8), training, cluster, eff)
    _, attn2 = layer_compute_s(LLAMA8, PlanConfig(cp=2, dp=4), training, cluster, eff)
    # half the attention FLOPs per rank, each at the 2,048-token chunk's lower efficiency
    assert attn2 > 0.5 * attn1 * 1.1
    total1, _ = layer_compute_s(LLAMA8, PlanConfig(dp=8, micro_batch=1), training, cluster, eff)
    total2, _ = layer_compute_s(LLAMA8, PlanConfig(cp=2, dp=4, micro_batch=2), training, cluster, eff)
    assert total2 > total1  # the same tokens per rank cost more under CP at 8K


@pytest.mark.parametrize(("gpu", "bf16", "hbm_gb", "family", "capacity"), [
    ("h100-pcie", 756.5, 80, "H100 family", 80e9), ("h100-nvl", 835.5, 94, "H100 family", 94e9),
    ("gb200", 2500.0, 186, "transferred", 189_471 * 2**20), ("mi355x", 2500.0, 288, "defaults", 288e9),
])
def test_gpu_variants_plan_with_their_own_peaks_and_say_which_constants_they_use(gpu, bf16, hbm_gb, family,
                                                                                 capacity):
    """Defect 6: GPU variants. Dense peaks from the vendors' datasheets (hardware.py); the planner uses the
    H100 family's fitted fractions for the GH100 parts, transfers them to GB200, keeps the defaults for
    MI355X, and says so in the efficiency's source."""
    result = plan("llama3-8b", f"16x{gpu}")
    cluster = result.clusters[0]
    assert cluster.gpu.bf16_tflops == bf16 and cluster.gpu.hbm_gb == hbm_gb
    # the capacity a run has: CUDA's (nvidia-smi's for GB200, memory.DEVICE_BYTES) where published, else hbm_gb x 1e9
    assert result.best is not None and result.best.memory.capacity_bytes == capacity
    assert family in Efficiency.for_gpu(gpu).source
