"""The pipeline schedule run as an executable model (pipeline.run_schedule): every rank executes the order the
memory model counts in-flight activations from, each operation waiting on the one it needs. It must reproduce
the closed-form bubble the step time uses for Megatron-LM's orders, and it finds what a closed form cannot:
an order that deadlocks."""

from __future__ import annotations

import itertools

import pytest

from wavefront.workbench.planner.pipeline import (
    ScheduleDeadlock,
    _order,
    bubble_stage_times,
    chunk_layers,
    critical_transfers,
    run_schedule,
)


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
