"""Step-time model: collective costs, bubble, tensor/context/data-parallel communication and overlap,
the optimizer, and agreement with the DDP bucket simulation."""

from __future__ import annotations

import pytest

from wavefront.shapes import get_model
from wavefront.workbench.distributed.overlap import predict_ddp_exposed
from wavefront.workbench.planner import Efficiency, Link, PlanConfig, Training, make_cluster, step_time
from wavefront.workbench.planner.comm_model import AlphaBeta
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.time import (
    bucketed_exposed_s,
    layer_compute_s,
    output_layer_s,
    tp_comm_per_layer_s,
)

MODEL = ModelSpec(get_model("llama3-8b"))
EFF = Efficiency(gemm=0.7, attention=0.5, hbm=0.9)


def _training(batch_seqs=64, seq=4096, **kw):
    return Training(global_batch_tokens=batch_seqs * seq, seq_len=seq, **kw)


def test_link_collective_costs():
    link = Link(busbw_gbps=100.0, latency_us=10.0)
    # all-reduce of 1 GB over 8 ranks: 10 us + 1.75 * 1e9 / 100e9 s
    assert link.time_s("all_reduce", 1e9, 8) == pytest.approx(10e-6 + 0.0175)
    assert link.time_s("all_gather", 1e9, 8) == pytest.approx(10e-6 + 0.00875)
    assert link.time_s("send_recv", 1e9, 2) == pytest.approx(10e-6 + 0.01)
    assert link.time_s("all_reduce", 1e9, 1) == 0.0


def test_groups_inside_a_node_use_the_intra_link():
    cluster = make_cluster("64xh100", intra_gbps=300, inter_gbps=40)
    assert cluster.link("all_reduce", 8, 1).busbw_gbps == 300  # tp 8 inside a node
    assert cluster.link("all_reduce", 2, 4).busbw_gbps == 300  # 2 ranks 4 apart: still one node
    assert cluster.link("all_reduce", 2, 8).busbw_gbps == 40  # dp across nodes
    assert cluster.link("all_reduce", 16, 1).busbw_gbps == 40


def test_bubble_is_p_minus_one_over_v_micro_batch_times():
    cluster = make_cluster("32xa100")
    training = _training(batch_seqs=32)
    base = dict(tp=8, sp=True, pp=4, dp=1, zero=1, recompute="selective", micro_batch=1)
    plain = step_time(MODEL, PlanConfig(vpp=1, **base), training, cluster, EFF)
    inter = step_time(MODEL, PlanConfig(vpp=2, **base), training, cluster, EFF)
    assert plain.n_micro == 32
    per_mb = (plain.step_s - plain.bubble_s - plain.dp_comm_s - plain.optimizer_s) / plain.n_micro
    out = output_layer_s(MODEL, PlanConfig(vpp=1, **base), training, cluster, EFF)
    # bubble = (p-1) x one micro-batch's stage time (without the output layer, which only the last stage runs)
    assert plain.bubble_s == pytest.approx(3 * (per_mb - out))
    assert inter.bubble_s < plain.bubble_s
    assert plain.pp_p2p_s > 0.0
    # interleaving overlaps its transfers with compute (overlap_p2p_comm): the step waits only on the
    # 2 (pp vpp - 1) along its critical path, once a step rather than per micro-batch
    send = plain.pp_p2p_s / (2 * plain.n_micro)
    assert inter.pp_p2p_s == pytest.approx(2 * (4 * 2 - 1) * send)
    no_pp = step_time(MODEL, PlanConfig(tp=8, sp=True, pp=1, dp=4, zero=1, recompute="selective"), training, cluster,
                      EFF)
    assert no_pp.bubble_s == 0.0 and no_pp.pp_p2p_s == 0.0


def test_the_step_runs_at_the_pace_of_the_busiest_rank_of_the_memory_models_layout():
    """Llama 3 405B's 126 layers on pp x vpp chunks that do not divide them: the first and last chunks hold one
    fewer layer (pipeline.chunk_layers, as Megatron's account_for_embedding/loss_in_pipeline_split and Meta's
    uneven stages place them). At PP16 VP4 the middle ranks run 8 layers and the last 7 plus the output
    layer: at 8K tokens and TP4 the output layer costs less than a layer, so a middle rank sets the pace.
    With a vocabulary large enough that the output layer outweighs a layer, the last rank sets it; with 128
    layers (no uneven chunk), the last rank's 8 layers plus the output layer."""
    from dataclasses import replace as _replace

    from wavefront.workbench.planner.memory import busiest_candidates
    from wavefront.workbench.planner.pipeline import chunk_layers

    big = ModelSpec(get_model("llama3-405b"))
    cluster = make_cluster("256xh100")
    training = _training(batch_seqs=64, seq=8192, precision="fp8")
    cfg = PlanConfig(tp=4, sp=True, pp=16, vpp=4, dp=4, zero=1, micro_batch=1)
    assert [sum(r) for r in chunk_layers(126, 16, 4)] == [7] + [8] * 14 + [7]
    ranks = {r: (d, m) for r, d, m, _, _ in busiest_candidates(big, cfg)}
    assert ranks[0] == (7, 0) and ranks[15] == (7, 0) and (8, 0) in ranks.values()
    layer_s, _ = layer_compute_s(big, cfg, training, cluster, EFF)
    out = output_layer_s(big, cfg, training, cluster, EFF)
    assert out < layer_s
    t = step_time(big, cfg, training, cluster, EFF)
    assert t.compute_s == pytest.approx(t.n_micro * 8 * layer_s)  # a middle rank, not 8 layers + the output
    wide = _replace(big, dims=_replace(big.dims, vocab=big.dims.vocab * 8))
    wide_out = output_layer_s(wide, cfg, training, cluster, EFF)
    assert wide_out > layer_s
    t_wide = step_time(wide, cfg, training, cluster, EFF)
    assert t_wide.compute_s == pytest.approx(t_wide.n_micro * (7 * layer_s + wide_out))
    even = _replace(big, dims=_replace(big.dims, n_layers=128))
    t128 = step_time(even, cfg, training, cluster, EFF)
    assert t128.compute_s == pytest.approx(t128.n_micro * (8 * layer_s + out))


def test_recompute_costs_time():
    cluster = make_cluster("8xh100")
    training = _training()
    times = {rc: layer_compute_s(MODEL, PlanConfig(dp=8, recompute=rc), training, cluster, EFF)[0]
             for rc in ("none", "op", "selective", "every-other", "full")}
    assert times["none"] < times["op"] < times["every-other"] < times["full"]
    assert times["none"] < times["selective"] < times["full"]
    # every-other layer recomputes half the forwards full recomputation does
    assert times["every-other"] - times["none"] == pytest.approx(0.5 * (times["full"] - times["none"]))
    # one more forward: between a third and half of fwd + bwd (flash attention's backward is 2.5x its forward)
    assert 1.25 < times["full"] / times["none"] < 4 / 3 + 1e-9


def test_tensor_parallel_comm():
    cluster = make_cluster("8xh100", intra_gbps=300, intra_latency_us=0)
    training = _training(seq=4096, tp_overlap=0.0)
    assert tp_comm_per_layer_s(MODEL, PlanConfig(tp=1, dp=8), training, cluster) == 0.0
    one = tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, dp=1), training, cluster)
    # 4 all-reduces of b*s*h*2 bytes per layer and micro-batch (Narayanan Sec. 3.2.2)
    assert one == pytest.approx(4 * 1.75 * 2 * 4096 * 4096 / 300e9)
    # by default half of it is hidden behind the GEMMs (training.TP_OVERLAP: userbuffers / async TP)
    assert tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, dp=1), _training(seq=4096), cluster) == pytest.approx(0.5 * one)
    full = tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, dp=1, recompute="full"), training, cluster)
    assert full == pytest.approx(one * 6 / 4)
    sp = tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, sp=True, dp=1), training, cluster)
    assert sp == pytest.approx(one)  # all-gather + reduce-scatter move the same bytes with zero latency


def test_data_parallel_overlap_and_zero3_volume():
    cluster = make_cluster("64xh100")
    overlapped = step_time(MODEL, PlanConfig(dp=64, zero=0), _training(batch_seqs=64), cluster, EFF)
    after = step_time(MODEL, PlanConfig(dp=64, zero=0), _training(batch_seqs=64, dp_overlap=False), cluster, EFF)
    assert after.dp_comm_s == pytest.approx(after.dp_comm_total_s)
    assert overlapped.dp_comm_s < after.dp_comm_s
    assert overlapped.dp_comm_total_s == pytest.approx(after.dp_comm_total_s)
    z1 = step_time(MODEL, PlanConfig(dp=64, zero=1), _training(batch_seqs=64, dp_overlap=False), cluster, EFF)
    z3 = step_time(MODEL, PlanConfig(dp=64, zero=3), _training(batch_seqs=64, dp_overlap=False), cluster, EFF)
    # ZeRO-3 per micro-batch: 2 all-gathers of bf16 weights + a reduce-scatter of fp32 grads; ZeRO-1: 1 + 1
    ratio = (2 * 2 + 4) / (4 + 2)
    assert z3.dp_comm_total_s == pytest.approx(z1.dp_comm_total_s * ratio, rel=0.01)
    assert z1.optimizer_s == pytest.approx(after.optimizer_s / 64)  # optimizer states sharded


def test_context_parallel_comm_hides_behind_attention_when_small():
    cluster = make_cluster("8xh100")
    long = Training(global_batch_tokens=2 * 131072, seq_len=131072)
    t = step_time(MODEL, PlanConfig(cp=8, dp=1, recompute="full"), long, cluster, EFF)
    assert t.cp_comm_s == 0.0  # GQA K/V of a 16k chunk are tiny next to its attention
    slow = make_cluster("8xh100", intra_gbps=0.5)
    t2 = step_time(MODEL, PlanConfig(cp=8, dp=1, recompute="full"), long, slow, EFF)
    assert t2.cp_comm_s > 0.0


def test_fp8_speeds_up_matmuls_only():
    cluster = make_cluster("8xh100")
    bf16 = step_time(MODEL, PlanConfig(dp=8, zero=1), _training(), cluster, EFF)
    fp8 = step_time(MODEL, PlanConfig(dp=8, zero=1), _training(precision="fp8"), cluster, EFF)
    assert fp8.compute_s < bf16.compute_s
    assert fp8.compute_s > bf16.compute_s / 2  # attention, norms and the output layer stay bf16


@pytest.mark.parametrize("backward_s", [0.01, 0.2, 0.5])
@pytest.mark.parametrize("n_buckets", [1, 7, 40])
def test_closed_form_dp_exposure_matches_bucket_simulation(backward_s, n_buckets):
    """time.bucketed_exposed_s against overlap.predict_ddp_exposed on uniform gradients, bandwidth-bound
    and hidden regimes alike."""
    cluster = make_cluster("64xh100", gpus_per_node=64, intra_gbps=40.0, intra_latency_us=20.0)
    ab = AlphaBeta("all_reduce", 64, 20.0, 40.0, 2, 8, 1 << 30, 0.0)
    bucket = 25e6
    grads = [int(bucket)] * n_buckets
    closed = bucketed_exposed_s(cluster, "all_reduce", bucket * n_buckets, bucket, 64, 1, backward_s)
    simulated = predict_ddp_exposed(grads, backward_s, int(bucket), ab, int(bucket))
    assert closed == pytest.approx(simulated, rel=1e-9)
