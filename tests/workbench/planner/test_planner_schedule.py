"""The pipeline schedule run as an executable model (pipeline.run_schedule): every rank executes the order the
memory model counts in-flight activations from, each operation waiting on the one it needs. It must reproduce
the closed-form bubble the step time uses for Megatron-LM's orders, and it finds what a closed form cannot:
an order that deadlocks. ZB-H1 (pipeline.zb_h1_order) runs on the same executor with the weight gradient split
off the backward: its bubble, its in-flight counts and what the step time and memory model take from them."""

from __future__ import annotations

import itertools
import random

import pytest

from wavefront.shapes import get_model
from wavefront.workbench.planner import Efficiency, PlanConfig, Training, make_cluster
from wavefront.workbench.planner.memory import activation_kwargs, memory_breakdown, zb_state_bytes
from wavefront.workbench.planner.model import ModelSpec, layer_activation_bytes, layer_matmul_flops
from wavefront.workbench.planner.pipeline import (
    ScheduleDeadlock,
    _order,
    bubble_stage_times,
    chunk_layers,
    critical_transfers,
    grad_sync_launches,
    interleaved_gather_exposed,
    interleaved_reduce_exposed,
    run_schedule,
    run_zb_h1,
    zb_h1_bubble,
    zb_h1_live,
    zb_h1_order,
    zbv_bubble,
    zbv_live,
    zbv_order,
)
from wavefront.workbench.planner.time import layer_passes, step_time


@pytest.mark.parametrize("pp,vpp", list(itertools.product((2, 3, 4, 8, 16), (1, 2, 3, 4, 8))))
def test_megatron_orders_run_and_their_bubble_is_the_closed_form(pp, vpp):
    """1F1B and the interleaved schedule (rounds of pp), 1 to 4 rounds of micro-batches (and, for 1F1B, micro-
    batch counts that are no multiple of pp): (pp - 1) / vpp micro-batch stage times of idle on the busiest
    rank (Narayanan et al. 2021, Sec. 2.2), and every rank busy m x (forward + backward)."""
    counts = [pp * k for k in (1, 2, 4)] + ([pp + 1, 3 * pp - 1] if vpp == 1 else [])
    for m in counts:
        assert bubble_stage_times(pp, vpp, m) == pytest.approx((pp - 1) / vpp, abs=1e-9), m
        fwd = [[1.0 / vpp] * vpp for _ in range(pp)]
        span, busy = run_schedule(pp, vpp, m, fwd, [[2.0 / vpp] * vpp for _ in range(pp)])
        assert busy == pytest.approx([3.0 * m] * pp) and span == pytest.approx(3.0 * m + 3.0 * (pp - 1) / vpp)


def test_rounds_below_pp_wait_on_the_round_trip_or_deadlock():
    """Llama 3's rounds of N micro-batches (Dubey et al. 2024, Sec. 3.3.2) in the order the memory model holds
    (warm-up 2 (pp - 1 - r) + (vpp - 1) N): N = pp - 1 runs, idling on every round's trip through the
    pipeline, more with every round; N <= pp - 2 deadlocks from the second round on (rank 0 has run every
    forward it can and waits on a forward that needs its own backward; pp 4 with N = 1 from the third); one
    round of N < pp (fewer micro-batches than stages, the case the paper names) runs; N > pp (the paper's
    Fig. 6 example, N = 5 on 4 stages) runs."""
    for pp, vpp in ((4, 2), (8, 4), (16, 8)):
        closed = (pp - 1) / vpp
        waits = [bubble_stage_times(pp, vpp, k * (pp - 1), pp - 1) for k in (1, 2, 3)]
        assert closed < waits[0] < waits[1] < waits[2]
        for n in range(1, pp - 1):
            first_stuck = 3 if (pp, n) == (4, 1) else 2
            assert bubble_stage_times(pp, vpp, (first_stuck - 1) * n, n) >= closed
            with pytest.raises(ScheduleDeadlock, match=f"rounds of {n}\\) deadlocks: rank "):
                bubble_stage_times(pp, vpp, first_stuck * n, n)
    assert bubble_stage_times(4, 2, 10, 5) >= 1.5
    with pytest.raises(ValueError, match="divisible by the round size"):
        run_schedule(4, 2, 9, [[1.0, 1.0]] * 4, [[2.0, 2.0]] * 4, 2)


def test_the_deadlock_is_a_cycle_of_order_and_dependency():
    """The smallest case by hand: pp 4, vpp 2, rounds of 2, 4 micro-batches. Rank 0 runs all 8 forwards
    first; its forward of micro-batch 3 on chunk 1 needs rank 3's forward of micro-batch 3 on chunk 0,
    which rank 3 runs after its backward of micro-batch 0 on chunk 0, which needs rank 0's backward of
    micro-batch 0 on chunk 1: after rank 0's last forward in rank 0's order. The executed model stops there."""
    rank0 = _order(4, 2, 4, 0, 2)
    assert rank0.index((True, 3, 1)) < rank0.index((False, 0, 1))
    rank3 = _order(4, 2, 4, 3, 2)
    assert rank3.index((False, 0, 0)) < rank3.index((True, 3, 0))
    with pytest.raises(ScheduleDeadlock, match="rank 0 at the forward of micro-batch 3 on chunk 1"):
        run_schedule(4, 2, 4, [[0.5, 0.5]] * 4, [[1.0, 1.0]] * 4, 2)


@pytest.mark.parametrize("layers,pp,vpp,m", [(126, 16, 8, 16), (126, 16, 8, 32), (126, 16, 4, 384),
                                             (126, 8, 8, 32), (61, 16, 1, 128), (94, 8, 3, 256), (94, 8, 1, 256)])
def test_uneven_layouts_the_closed_form_bubble_overestimates_by_little(layers, pp, vpp, m):
    """With uneven chunks (pipeline.chunk_layers) the step time prices the busiest rank's m micro-batches plus
    (pp - 1) / vpp of its stage time as the bubble; run with each chunk's own layers, the schedule idles
    less (its lighter end ranks fill part of it): the priced step is at most 1.5% longer, never shorter."""
    lay = chunk_layers(layers, pp, vpp)
    span, busy = run_schedule(pp, vpp, m, [[float(c) for c in row] for row in lay],
                              [[2.0 * c for c in row] for row in lay])
    heaviest = max(sum(row) for row in lay)
    assert max(busy) == pytest.approx(3.0 * m * heaviest)
    priced = max(busy) + (pp - 1) / vpp * 3.0 * heaviest
    assert span <= priced <= 1.015 * span


@pytest.mark.parametrize("pp,vpp", list(itertools.product((2, 3, 4, 8, 16), (2, 3, 4, 8))))
def test_interleaved_transfers_on_the_critical_path_are_one_trip_through_every_chunk(pp, vpp):
    """Sent ahead and overlapped with compute (Megatron's overlap_p2p_comm), the transfers of the interleaved
    schedule still delay the step by the ones on its critical path: 2 (pp vpp - 1), forward through every
    model chunk and back, whatever the number of micro-batches (the step time's pp p2p term for vpp > 1)."""
    for m in (pp, 2 * pp, 4 * pp):
        assert critical_transfers(pp, vpp, m) == pytest.approx(2 * (pp * vpp - 1)), m


def _times(rng: random.Random) -> tuple[float, float, float]:
    return rng.uniform(0.3, 1.5), rng.uniform(0.3, 2.0), rng.uniform(0.1, 1.5)


@pytest.mark.parametrize("pp", [2, 3, 4, 5, 8, 16])
def test_zb_h1_runs_and_idles_as_its_closed_form(pp):
    """ZB-H1's order holds every pass once, each weight-gradient pass after its own input-gradient pass; run
    with random pass times (forward f, input gradient b, weight gradient w) it never deadlocks, and with at
    least pp micro-batches its busiest rank idles exactly (pp - 1) max(f + b - w, f, b): Qi et al.'s
    (pp - 1)(f + b - w) while w <= min(f, b), a third of 1F1B's (pp - 1)(f + b + w) at f = b = w. 1F1B run
    on the same executor (W fused into B) idles (pp - 1)(f + b + w). Fewer micro-batches than stages idle
    at least the closed form; zb_h1_bubble runs the order for them."""
    rng = random.Random(pp)
    for m in sorted({1, 2, pp - 1, pp, pp + 1, 2 * pp, 3 * pp + 1} - {0}):
        for r in range(pp):
            order = zb_h1_order(pp, m, r)
            assert sorted(order) == sorted((k, i) for k in "BFW" for i in range(m))
            assert all(order.index(("B", i)) < order.index(("W", i)) for i in range(m))
        for f, b, w in [(1.0, 1.0, 1.0)] + [_times(rng) for _ in range(12)]:
            span, busy = run_zb_h1(pp, m, f, b, w)
            assert busy == pytest.approx([m * (f + b + w)] * pp)
            closed = (pp - 1) * max(f + b - w, f, b)
            fused, fused_busy = run_schedule(pp, 1, m, [[f]] * pp, [[b + w]] * pp)
            assert fused - max(fused_busy) == pytest.approx((pp - 1) * (f + b + w))
            if m >= pp:
                assert span - max(busy) == pytest.approx(closed)
                assert zb_h1_bubble(pp, m, f, b, w) == pytest.approx(closed)
            else:
                assert span - max(busy) >= closed - 1e-9
                assert zb_h1_bubble(pp, m, f, b, w) == pytest.approx(span - max(busy), rel=0.01)
        assert zb_h1_bubble(pp, max(m, pp), 1.0, 1.0, 1.0) == pytest.approx((pp - 1) * (1.0 + 1.0 + 1.0) / 3)


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
def test_zb_h1_holds_pp_micro_batches_on_every_rank_and_1f1b_s_on_the_first(pp):
    """Qi et al. Sec. 2.1: ZB-H1 delays rank r's weight gradients so that every rank has as many micro-batches
    in flight as the first has under 1F1B. Counted from the order: rank r holds at most pp - r whole
    activations (1F1B's count) and, with those awaiting their weight gradient, at most pp; rank 0 never has
    more than one awaiting."""
    for m in (pp, 2 * pp, 4 * pp + 1):
        for r in range(pp):
            live = zb_h1_live(pp, m, r)
            assert max(full for full, _ in live) == min(pp - r, m)
            assert max(full + wait for full, wait in live) == pp
        assert max(wait for _, wait in zb_h1_live(pp, m, 0)) <= 1


def _llama70b() -> tuple[ModelSpec, Training, PlanConfig, PlanConfig]:
    model = ModelSpec(get_model("llama3-70b"))
    training = Training(global_batch_tokens=512 * 8192, seq_len=8192)
    return (model, training, PlanConfig(tp=8, sp=True, pp=4, dp=2), PlanConfig(tp=8, sp=True, pp=4, dp=2,
                                                                            zero_bubble=True))


def test_zb_h1_step_time_prices_the_bubble_of_the_layer_s_own_passes():
    """The step time splits a layer into forward, input-gradient and weight-gradient passes (time.layer_passes:
    the weight gradient is the dW GEMMs, the same FLOPs as the forward's matmuls) and prices ZB-H1's bubble
    with them: the ratio to 1F1B's is max(f + b - w, f, b) / (f + b + w), not a fixed third. For Llama 3 70B
    the weight gradient is lighter than the input gradient (attention's backward has no weights), so ZB-H1
    keeps about half of 1F1B's bubble."""
    model, training, plain, zb = _llama70b()
    cluster, eff = make_cluster("64xh100"), Efficiency.for_gpu("h100")
    total, _, f, w = layer_passes(model, plain, training, cluster, eff)
    flops = layer_matmul_flops(model, training.seq_len) / plain.tp
    peak = cluster.gpu.peak_tflops("bf16") * 1e12 * eff.gemm
    assert 1.0 <= w * peak / flops <= 1.25  # the dW GEMMs at the GEMM efficiency, tile quantization only
    b = total - f - w
    assert 0 < w < b and f + w < total
    ratio = step_time(model, zb, training, cluster, eff).bubble_s / step_time(model, plain, training, cluster,
                                                                               eff).bubble_s
    assert ratio == pytest.approx(max(f + b - w, f, b) / total, rel=1e-6)
    assert 0.4 < ratio < 0.6


def test_zb_h1_memory_counts_the_deferred_weight_gradient_inputs():
    """What waits for a deferred weight gradient (memory.zb_state_bytes: each linear's X and dY) is about a
    whole layer activation for Llama 3 (Qi et al.'s Table 1: 32 sbh of 34 sbh), so ZB-H1 holds about
    pp activations on every rank: its first rank's activations are 1F1B's, and the plan's memory is at least
    1F1B's."""
    model, training, plain, zb = _llama70b()
    full = layer_activation_bytes(model, recompute="none", **activation_kwargs(model, plain, training))
    assert 0.85 < zb_state_bytes(model, plain, training) / full < 1.15
    cluster = make_cluster("64xh100")
    one, zero = memory_breakdown(model, plain, training, cluster), memory_breakdown(model, zb, training, cluster)
    assert zero.total_bytes >= one.total_bytes
    assert zero.activations_bytes <= 1.1 * one.activations_bytes
    no_sp = PlanConfig(tp=8, sp=False, pp=4, dp=2)
    assert zb_state_bytes(model, no_sp, training) > zb_state_bytes(model, plain, training)


def _stream_end(launches: list[float], seconds: float) -> float:
    free = float("-inf")
    for t in launches:
        free = max(t, free) + seconds
    return free


@pytest.mark.parametrize("pp,vpp", list(itertools.product((2, 3, 4, 8, 16), (2, 3, 5, 8))))
def test_interleaved_gradient_reductions_run_past_the_step_as_the_closed_form(pp, vpp):
    """Megatron-LM's interleaved schedule launches each model chunk's gradient reduction after its last
    backward, aligned across ranks (grad_sync_launches, from the run order); on one stream per rank they run
    past the step's compute by exactly max over j < vpp of (j + 1) t - j pp b (t one chunk's reduction, b one
    chunk's backward of a micro-batch, here 2 / vpp of a stage forward), and rank 0 is the last to finish.
    Small reductions expose one chunk's, not the stage's."""
    rng = random.Random(pp * 100 + vpp)
    for m in (pp, 2 * pp, 4 * pp):
        runs = [grad_sync_launches(pp, vpp, m, r) for r in range(pp)]
        span = runs[0][0]
        assert all(run[0] == span for run in runs) and all(len(run[1]) == vpp for run in runs)
        for t in [0.01, 0.5, 2.0 / vpp * pp, 3.0] + [rng.uniform(0.0, 4.0) for _ in range(3)]:
            past = [_stream_end(launches, t) - span for _, launches in runs]
            assert max(past) == pytest.approx(past[0], abs=1e-9)
            assert max(0.0, past[0]) == pytest.approx(interleaved_reduce_exposed(pp, vpp, t, 2.0 / vpp), abs=1e-9)
        assert interleaved_reduce_exposed(pp, vpp, 0.01, 2.0 / vpp) == pytest.approx(0.01)


@pytest.mark.parametrize("pp,vpp", [(2, 2), (4, 5), (8, 6), (8, 8), (16, 4)])
def test_interleaved_parameter_gathers_wait_on_their_chunk_s_first_forward(pp, vpp):
    """The parameter all-gathers (overlap_param_gather): chunks 0 and 1 from the start, chunk c >= 2 from the
    first forward of chunk c - 1, one stream; rank 0's first forward of chunk c starts where the run puts it
    (c pp forwards of a chunk in), and the forwards slip by the largest lateness. interleaved_gather_exposed
    against that reference: nothing waits while each gather fits in pp chunk forwards, and the wait grows
    once they do not."""
    m = 2 * pp
    ends: dict = {}
    run_schedule(pp, vpp, m, [[1.0 / vpp] * vpp] * pp, [[2.0 / vpp] * vpp] * pp, ends=ends)
    first_fwd = [min(ends[("F", i, k * pp)] for i in range(m)) - 1.0 / vpp for k in range(vpp)]
    assert first_fwd == pytest.approx([k * pp / vpp for k in range(vpp)])
    for t in (0.05, 0.5, pp / vpp, 1.5 * pp / vpp, 4.0):
        first = max(0.0, t - 1.0 / vpp)
        delay, free = first, t
        for c in range(1, vpp):
            release = 0.0 if c == 1 else first_fwd[c - 1] + delay
            free = max(release, free) + t
            delay = max(delay, free - first_fwd[c])
        assert interleaved_gather_exposed(pp, vpp, t, 1.0 / vpp, first) == pytest.approx(delay)
    assert interleaved_gather_exposed(pp, vpp, 0.5 * pp / vpp, 1.0 / vpp, 0.0) == 0.0
    assert interleaved_gather_exposed(pp, vpp, 2.0 * pp / vpp, 1.0 / vpp, 0.0) > 0.0


def test_the_step_time_prices_interleaved_data_parallel_sync_chunk_by_chunk():
    """GPT-3 175B at TP4 PP8 VP6 over 16 data-parallel groups on 512 H100 (NeMo's plan): the exposed
    data-parallel time is the per-chunk closed forms, far below the whole stage's reduction under one
    micro-batch's backward that 1F1B exposes; the same plan without interleaving keeps that form."""
    model = ModelSpec(get_model("gpt3-175b"))
    training = Training(global_batch_tokens=2048 * 2048, seq_len=2048)
    cluster, eff = make_cluster("512xh100"), Efficiency.for_gpu("h100")
    inter = step_time(model, PlanConfig(tp=4, sp=True, pp=8, vpp=6, dp=16, zero=1, micro_batch=2), training,
                      cluster, eff)
    plain = step_time(model, PlanConfig(tp=4, sp=True, pp=8, dp=16, zero=1, micro_batch=2), training, cluster, eff)
    assert inter.dp_comm_total_s == pytest.approx(plain.dp_comm_total_s, rel=0.01)
    assert 0.0 < inter.dp_comm_s < 0.3 * plain.dp_comm_s


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_zbv_runs_and_holds_1f1b_s_activations(pp):
    """torch's ZBV order (zbv_order: two chunks a rank in a V, the weight gradient split off): every pass
    once, each W after its own input-gradient pass; run with random pass times it never deadlocks, idles
    (pp - 1) f / 2 at f = b = w once m >= 2 pp (the start-up of one chunk a stage: half ZB-H1's), never more
    than ZB-H1 then, and every rank holds at most 2 pp chunk activations, whole or awaiting their weight
    gradient: 1F1B's first-rank count, as Qi et al. state for ZB-V."""
    rng = random.Random(pp)
    for m in sorted({1, 2, pp, 2 * pp, 4 * pp + 3}):
        for r in range(pp):
            order = zbv_order(pp, m, r)
            assert sorted(order) == sorted((kind, i, k) for kind in "BFW" for i in range(m) for k in (0, 1))
            assert all(order.index(("B", i, k)) < order.index(("W", i, k)) for i in range(m) for k in (0, 1))
            if m >= 2 * pp:
                assert max(sum(row) for row in zbv_live(pp, m, r)) == 2 * pp
        for f, b, w in [(1.0, 1.0, 1.0)] + [_times(rng) for _ in range(4)]:
            idle = zbv_bubble(pp, m, f, b, w)
            assert idle >= 0.0
            if m >= 2 * pp:
                assert idle <= zb_h1_bubble(pp, m, f, b, w) + 1e-2 * (f + b + w)
        if m >= 2 * pp:
            assert zbv_bubble(pp, m, 1.0, 1.0, 1.0) == pytest.approx((pp - 1) / 2.0, abs=1e-2)


def test_zbv_plan_is_priced_by_its_run_and_holds_about_1f1b_s_memory():
    """`wavefront train --pp-schedule zbv` is predicted as PlanConfig(vpp=2, zero_bubble=True): its bubble comes
    from running torch's order with the layer's passes, below ZB-H1's and the interleaved schedule's at the same
    pp, and its activations are about 1F1B's (the interleaved order at vpp 2 holds more)."""
    model, training, plain, zb = _llama70b()
    cluster, eff = make_cluster("64xh100"), Efficiency.for_gpu("h100")
    zbv = PlanConfig(tp=8, sp=True, pp=4, vpp=2, dp=2, zero_bubble=True)
    inter = PlanConfig(tp=8, sp=True, pp=4, vpp=2, dp=2)
    bubble = {name: step_time(model, cfg, training, cluster, eff).bubble_s
              for name, cfg in (("1f1b", plain), ("zb", zb), ("zbv", zbv), ("inter", inter))}
    assert 0.0 < bubble["zbv"] < bubble["zb"] < bubble["1f1b"] and bubble["zbv"] < bubble["inter"]
    acts = {name: memory_breakdown(model, cfg, training, cluster).activations_bytes
            for name, cfg in (("1f1b", plain), ("zbv", zbv), ("inter", inter))}
    assert acts["1f1b"] <= acts["zbv"] <= 1.1 * acts["1f1b"] < acts["inter"]


def test_zbv_lays_its_layers_out_as_the_v():
    """In ZBV's V rank r holds model chunks r and 2 pp - 1 - r: rank 0 holds both ends, the embedding and the
    output layer, and with uneven chunks (pipeline.chunk_layers: one fewer layer on the first and last
    chunks) both short ones; the interleaved layout puts the second end on rank pp - 1."""
    from wavefront.workbench.planner.memory import output_rank, pipeline_ranks

    model = ModelSpec(get_model("llama3-8b"))  # 32 layers on 3 x 2 chunks: 6, 5, 5, 5, 5, ... uneven
    zbv = PlanConfig(pp=3, vpp=2, dp=1, zero_bubble=True)
    inter = PlanConfig(pp=3, vpp=2, dp=1)
    assert output_rank(zbv) == 0 and output_rank(inter) == 2
    lay = chunk_layers(32, 3, 2)
    counts = [lay[g % 3][g // 3] for g in range(6)]  # model chunk g = k pp + r
    assert counts[0] == counts[5] == min(counts) < max(counts)
    v = {r: (dense, params) for r, dense, _, params, _ in pipeline_ranks(model, zbv)}
    plain = {r: (dense, params) for r, dense, _, params, _ in pipeline_ranks(model, inter)}
    assert v[0][0] == [counts[0], counts[5]] and plain[0][0] == [counts[0], counts[3]]
    layer = model.layer_matmul_params + 2 * model.dims.hidden
    emb = model.embedding_params
    assert v[0][1] == pytest.approx(sum(v[0][0]) * layer + 2 * emb + model.dims.hidden)
    assert plain[0][1] == pytest.approx(sum(plain[0][0]) * layer + emb)
