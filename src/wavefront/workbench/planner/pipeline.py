"""Pipeline schedules as they hold activations: which layers each rank's model chunks carry, and how many
micro-batches of each chunk a rank keeps in flight, found by stepping through the schedule's order.

Layers over chunks: pp ranks x vpp virtual stages make n = pp*vpp model chunks; model chunk g = k*pp + r
(virtual stage k on rank r, Megatron-LM's layout) holds consecutive layers. Each gets ceil(L/n) layers;
when n does not divide L, the n*ceil(L/n) - L missing layers come off the ends one each, first chunk,
last chunk, second, second-to-last, ...: the first and last chunks also carry the embedding and the
output layer (Llama 3 405B: 126 layers on 16 x 8 chunks leaves the first chunk of rank 0 with the
embedding only and the last chunk of rank 15 with the output layer only; Dubey et al. 2024, Sec. 3.3.2;
without interleaving, one layer fewer on the first and on the last stage).

Schedule (Megatron-LM's, Narayanan et al. 2021): 1F1B runs min(pp - r - 1, m) warm-up forwards on rank
r, then alternates one forward and one backward, then drains the backwards. The interleaved schedule
takes micro-batches in rounds of N = pp per chunk (forward k is chunk (k mod N*vpp) // N of micro-batch
(k // (N*vpp)) N + k mod N; backwards run the chunks in reverse) with min(2 (pp - r - 1) +
(vpp - 1) N, m vpp) warm-up forwards. Llama 3's schedule (Dubey et al. 2024, Sec. 3.3.2 and Fig. 6)
makes N, the contiguous micro-batches of a round, tunable instead of pp (`round_size`; PyTorch's
Interleaved1F1B has the same warm-up, (vpp - 1) N + 2 (pp - 1 - r)): a smaller N holds fewer chunks in
flight at the cost of bubbles when N < pp; N must divide m here. A forward makes its (micro-batch,
chunk) activations live, its backward frees them; the peak is the largest live set after a forward.
The counts are per chunk, so uneven chunks weigh in exactly.

ZB-H1 and ZBV (Qi et al. 2023) split each backward into the input-gradient pass (B) and the weight gradient
(W); their orders (zb_h1_order; zbv_order, torch's) run on the same executor with three kinds of pass, and
their live sets count whole activations (forward done, B not) and what waits for a deferred W apart
(zb_h1_live, zbv_live): ZB-H1 keeps 1F1B's forwards and B passes in 1F1B's order, so rank r holds 1F1B's
whole activations plus up to r micro-batches awaiting W. The executor also runs Megatron-LM's interleaved
order to find when each model chunk's gradient reduction is launched (grad_sync_launches).
"""

from __future__ import annotations

from functools import cache
from operator import mul
from typing import Any


def chunk_layers(n_layers: int, pp: int, vpp: int) -> list[list[int]]:
    """layers[r][k]: layers of virtual stage k on rank r (module docstring)."""
    n = pp * vpp
    each = -(-n_layers // n)
    counts = [each] * n
    ends = [i // 2 if i % 2 == 0 else n - 1 - i // 2 for i in range(n)]  # 0, n-1, 1, n-2, ...
    for g in ends[:n * each - n_layers]:
        counts[g] -= 1
    return [[counts[k * pp + r] for k in range(vpp)] for r in range(pp)]


def _warmup(pp: int, vpp: int, m: int, rank: int, n: int = 0) -> int:
    n = n or pp
    return min(pp - rank - 1, m) if vpp == 1 else min(2 * (pp - rank - 1) + (vpp - 1) * n, m * vpp)


def _order(pp: int, vpp: int, m: int, rank: int, round_size: int = 0) -> list[tuple[bool, int, int]]:
    """(is_forward, micro-batch, chunk) in the order rank `rank` runs them (the reference that
    live_counts' closed form is tested against); round_size N: micro-batches per round (0: pp)."""
    n = round_size or pp
    total, group = m * vpp, n * vpp

    def op(forward: bool, k: int) -> tuple[bool, int, int]:
        chunk = (k % group) // n
        return forward, (k // group) * n + k % n, chunk if forward else vpp - 1 - chunk

    warm = _warmup(pp, vpp, m, rank, n)
    ops = [op(True, k) for k in range(warm)]
    for i in range(total - warm):
        ops += [op(True, warm + i), op(False, i)]
    return ops + [op(False, k) for k in range(total - warm, total)]


class ScheduleDeadlock(ValueError):
    """The schedule's fixed per-rank order cannot run: every rank waits on another (pipeline.run_schedule)."""


#: What each kind of pass is called in a deadlock report.
_PASS_NAMES = {"F": "forward", "B": "backward", "W": "weight-gradient pass"}


def _execute(orders: list[list[tuple[str, int, int]]], seconds: list[dict[tuple[str, int], float]], pp: int,
             last: int, transfer: float, what: str,
             ends: dict[tuple[str, int, int], float] | None = None, v_shape: bool = False) -> tuple[float, list[float]]:
    """Run per-rank orders of passes (kind "F", "B" or "W", micro-batch, virtual stage) on pp ranks, model
    chunk g = k*pp + r (v_shape: two chunks a rank, g = r and 2 pp - 1 - r, the V of ZBV); seconds[r][(kind,
    k)] is a pass's time. F of micro-batch i on chunk g needs F of i on
    g - 1; B needs its own F and (below the last chunk) B of i on g + 1; W (the weight gradient split off a
    backward) needs its own B. What one chunk hands the next arrives `transfer` seconds after it is made,
    sent asynchronously. Returns (makespan, busy seconds per rank); a cycle raises ScheduleDeadlock. `ends`,
    when given, receives each pass's finish time, keyed (kind, micro-batch, model chunk g)."""
    done: dict[tuple[str, int, int], float] = {} if ends is None else ends
    clock, busy, at = [0.0] * pp, [0.0] * pp, [0] * pp
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for r in range(pp):
            while at[r] < len(orders[r]):
                kind, i, k = orders[r][at[r]]
                g = (2 * pp - 1 - r if k else r) if v_shape else k * pp + r
                if kind == "F":
                    needs = [("F", i, g - 1)] if g > 0 else []
                elif kind == "B":
                    needs = [("F", i, g)] + ([("B", i, g + 1)] if g < last else [])
                else:
                    needs = [("B", i, g)]
                if any(n not in done for n in needs):
                    break
                took = seconds[r][(kind, k)]
                arrive = [done[n] + (transfer if n[2] != g else 0.0) for n in needs]
                clock[r] = max([clock[r]] + arrive) + took
                busy[r] += took
                done[(kind, i, g)] = clock[r]
                at[r] += 1
                left -= 1
                moved = True
        if not moved:
            stuck = [(r, orders[r][at[r]]) for r in range(pp) if at[r] < len(orders[r])]
            waiting = [f"rank {r} at the {_PASS_NAMES[op[0]]} of micro-batch {op[1]} on chunk {op[2]}"
                       for r, op in stuck]
            blocked = "; ".join(waiting[:3]) + (f"; and {len(waiting) - 3} more ranks" if len(waiting) > 3 else "")
            raise ScheduleDeadlock(f"the schedule ({what}) deadlocks: {blocked}")
    return max(clock), busy


def run_schedule(pp: int, vpp: int, m: int, fwd: list[list[float]], bwd: list[list[float]],
                 round_size: int = 0, transfer: float = 0.0,
                 ends: dict[tuple[str, int, int], float] | None = None) -> tuple[float, list[float]]:
    """Execute the schedule: each rank r runs _order(pp, vpp, m, r, round_size) in that order, forward of
    chunk k taking fwd[r][k] seconds and its backward bwd[r][k]; returns (makespan, busy seconds per rank).

    Model chunk g = k*pp + r (module docstring). A forward of micro-batch i on chunk g starts when the rank
    is free and the forward of i on chunk g - 1 has finished; a backward of i on chunk g when the rank is
    free, the backward of i on chunk g + 1 has finished, and (the last chunk) its own forward has. What one
    chunk hands the next (an activation, or its gradient) arrives `transfer` seconds after it is made, sent
    asynchronously: no rank waits on its own sends (Megatron's overlap_p2p_comm). An order whose ranks end
    up all waiting on one another raises ScheduleDeadlock, naming each rank's blocked operation: whether an
    order deadlocks depends on the order only, not on the times. `ends`: as _execute's."""
    if vpp > 1 and m % (round_size or pp):
        raise ValueError(f"the interleaved schedule needs micro-batches ({m}) divisible by the round size "
                         f"({round_size or pp})")
    orders = [[("F" if forward else "B", i, k) for forward, i, k in _order(pp, vpp, m, r, round_size)]
              for r in range(pp)]
    seconds = [{(kind, k): (fwd if kind == "F" else bwd)[r][k] for kind in "FB" for k in range(vpp)}
               for r in range(pp)]
    return _execute(orders, seconds, pp, pp * vpp - 1, transfer,
                    f"pp {pp}, vpp {vpp}, {m} micro-batches, rounds of {round_size or pp}", ends)


def zb_h1_order(pp: int, m: int, rank: int) -> list[tuple[str, int]]:
    """ZB-H1's order on `rank` (Qi et al. 2023, arXiv:2401.10241, Sec. 2.1): 1F1B's forwards and input-gradient
    backwards (B), each micro-batch's weight gradient (W) split off and run r micro-batches late on rank r, so
    every rank has pp micro-batches between their forward and their W (1F1B's count on rank 0): (kind,
    micro-batch) pairs, W after the B of micro-batch j + r, the deferred ones at the end."""
    warm = min(pp - rank - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m):
        if i < m - warm:
            ops.append(("F", warm + i))
        ops.append(("B", i))
        if i >= rank:
            ops.append(("W", i - rank))
    return ops + [("W", j) for j in range(max(0, m - rank), m)]


def run_zb_h1(pp: int, m: int, f: float, b: float, w: float, transfer: float = 0.0) -> tuple[float, list[float]]:
    """Execute ZB-H1 (zb_h1_order) with every stage's forward f, input-gradient backward b and weight-gradient
    pass w seconds; returns (makespan, busy seconds per rank). 1F1B is the same run with W fused into B."""
    orders = [[(kind, i, 0) for kind, i in zb_h1_order(pp, m, r)] for r in range(pp)]
    seconds = [{("F", 0): f, ("B", 0): b, ("W", 0): w}] * pp
    return _execute(orders, seconds, pp, pp - 1, transfer, f"ZB-H1, pp {pp}, {m} micro-batches")


def zbv_order(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """ZBV's order on `rank` as torch.distributed.pipelining's ScheduleZBVZeroBubble runs it (torch 2.13; Qi et
    al. 2024, arXiv:2401.10241 Sec. 6): two chunks a rank in a V (chunk 0 is model chunk r, chunk 1 model chunk
    2 pp - 1 - r), (kind, micro-batch, chunk) with B the input-gradient pass and W the weight gradient. Warm-up:
    2 (pp - r) - 1 forwards of chunk 0, then r pairs (F1, F0), then pp - r rounds of (F1, B1, W1); steady
    rounds (F0 while any is left, B0, W0, F1, B1, W1) until chunk 1 has caught up; cool-down: r pairs (B0,
    B1), pp - r pairs (B0, W0 of the oldest waiting), then the waiting W1s and W0s. The order is laid out for
    max(2 pp - 1, m) micro-batches and the ones past m dropped, as torch does."""
    n = max(2 * pp - 1, m)
    ops: list[tuple[str, int, int]] = []
    count = {(kind, k): 0 for kind in "FBW" for k in (0, 1)}

    def add(kind: str, k: int, index: int | None = None) -> None:
        i = count[kind, k] if index is None else index
        ops.append((kind, i, k))
        count[kind, k] = i + 1 if index is None else count[kind, k]

    for _ in range(2 * (pp - rank) - 1):
        add("F", 0)
    for _ in range(rank):
        add("F", 1)
        add("F", 0)
    for _ in range(pp - rank):
        add("F", 1)
        add("B", 1)
        add("W", 1, count["B", 1] - 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < n:
        if count["F", 0] < n:
            add("F", 0)
        add("B", 0)
        add("W", 0, count["B", 0] - 1)
        add("F", 1)
        add("B", 1)
        add("W", 1, count["B", 1] - 1)
    waiting = {0: count["B", 0], 1: count["B", 1]}  # the first W not yet run, per chunk
    for _ in range(rank):
        add("B", 0)
        add("B", 1)
    for _ in range(pp - rank):
        add("B", 0)
        add("W", 0, waiting[0])
        waiting[0] += 1
    ops += [("W", i, 1) for i in range(waiting[1], count["B", 1])]
    ops += [("W", i, 0) for i in range(waiting[0], count["B", 0])]
    return [op for op in ops if op[1] < m]


def run_zbv(pp: int, m: int, f: float, b: float, w: float, transfer: float = 0.0) -> tuple[float, list[float]]:
    """Execute ZBV (zbv_order) with a stage's forward f, input-gradient b and weight-gradient w seconds per
    micro-batch, split evenly over its two chunks; returns (makespan, busy seconds per rank)."""
    orders = [zbv_order(pp, m, r) for r in range(pp)]
    seconds = [{(kind, k): t / 2.0 for kind, t in (("F", f), ("B", b), ("W", w)) for k in (0, 1)}] * pp
    return _execute(orders, seconds, pp, 2 * pp - 1, transfer, f"ZBV, pp {pp}, {m} micro-batches", v_shape=True)


def zbv_bubble(pp: int, m: int, f: float, b: float, w: float) -> float:
    """ZBV's idle seconds on its busiest rank, found by running torch's order (run_zbv, through _idle_run):
    at f = b = w and m >= 2 pp, (pp - 1) f / 2, the start-up of one chunk per stage; more as the passes
    differ (tests/workbench/planner/test_planner_schedule.py)."""
    return _idle_run("zbv", pp, m, f, b, w)


def _undominated(rows: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The live sets no other holds count by count, sorted: with bytes >= 0 only these can be the peak."""
    return sorted(r for r in rows if not any(o != r and all(a >= b for a, b in zip(o, r, strict=True))
                                             for o in rows))


def _split_live(passes: list[tuple[str, int]], chunks: int) -> tuple[tuple[int, ...], ...]:
    """The live sets of a split-backward order, (kind, chunk) pass by pass: per chunk the micro-batches
    between forward and input-gradient pass (whole activations), then per chunk those between that and their
    weight-gradient pass (what W reads); the undominated ones."""
    live = [0] * (2 * chunks)
    rows = set()
    for kind, k in passes:
        if kind == "F":
            live[k] += 1
        elif kind == "B":
            live[k] -= 1
            live[chunks + k] += 1
        else:
            live[chunks + k] -= 1
        rows.add(tuple(live))
    return tuple(_undominated(rows))


@cache
def zbv_live(pp: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
    """(whole activations of chunk 0, of chunk 1, micro-batches awaiting their weight gradient on chunk 0,
    on chunk 1) after each pass of ZBV's order on `rank`, the sets no other holds every count of."""
    return _split_live([(kind, k) for kind, _, k in zbv_order(pp, m, rank)], 2)


@cache
def _unit_idle(schedule: str, pp: int, m: int, f: float, b: float, w: float) -> float:
    span, busy = (run_zbv if schedule == "zbv" else run_zb_h1)(pp, m, f, b, w)
    return span - max(busy)


def _idle_run(schedule: str, pp: int, m: int, f: float, b: float, w: float) -> float:
    """A split-backward schedule's ("zb-h1" or "zbv") idle seconds on its busiest rank, its order run with
    the pass times rounded to 1e-3 of their sum (so that runs are cached across plans), scaled back."""
    unit = f + b + w
    if unit <= 0:
        return 0.0
    return unit * _unit_idle(schedule, pp, m, round(f / unit, 3), round(b / unit, 3), round(w / unit, 3))


def zb_h1_bubble(pp: int, m: int, f: float, b: float, w: float) -> float:
    """ZB-H1's idle seconds on its busiest rank, stages of equal pass times (forward f, input-gradient b,
    weight-gradient w): (pp - 1) max(f + b - w, f, b) when m >= pp, what running the order gives
    (tests/workbench/planner/test_planner_schedule.py checks it against run_zb_h1 over sizes and times;
    Qi et al.'s (pp - 1)(f + b - w) holds while w <= min(f, b)); fewer micro-batches than stages idle
    longer, so the order is run (_idle_run). 1F1B idles (pp - 1)(f + b + w)."""
    if m >= pp:
        return (pp - 1) * max(f + b - w, f, b)
    return _idle_run("zb-h1", pp, m, f, b, w)


@cache
def zb_h1_live(pp: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
    """(micro-batches between forward and input-gradient backward, micro-batches between that and their
    weight-gradient pass) after each pass of ZB-H1's order on `rank`, the sets no other holds both counts
    of: the first hold whole activations, the second only what W reads (memory.pipeline_candidates)."""
    return _split_live([(kind, 0) for kind, _ in zb_h1_order(pp, m, rank)], 1)


def custom_round(pp: int, round_size: int) -> int:
    """The round size N when it makes an order other than Megatron-LM's (Llama 3's schedule with N != pp),
    else 0: the closed forms hold for 0 and pp, any other N is priced by running its order."""
    return round_size if round_size and round_size != pp else 0


@cache
def _unit_run(pp: int, vpp: int, m: int, round_size: int, transfer: float) -> tuple[float, float]:
    """(makespan, busiest rank's busy time) of the order run with every chunk equal: a stage's forward 1,
    its backward 2, split over its vpp chunks."""
    fwd = [[1.0 / vpp] * vpp for _ in range(pp)]
    span, busy = run_schedule(pp, vpp, m, fwd, [[2.0 * t for t in row] for row in fwd], round_size, transfer)
    return span, max(busy)


def bubble_stage_times(pp: int, vpp: int, m: int, round_size: int = 0) -> float:
    """The schedule's idle time on its busiest rank, in units of one micro-batch's forward + backward on
    one stage (every chunk equal, backward twice the forward), found by running it (run_schedule): for
    Megatron-LM's orders (round_size 0 or pp) exactly (pp - 1) / vpp, Narayanan et al.'s closed form; a
    round of N < pp micro-batches waits on the round trip through the pipeline and adds to it, and
    N <= pp - 2 with more than one round deadlocks (ScheduleDeadlock)."""
    span, busy = _unit_run(pp, vpp, m, round_size, 0.0)
    return (span - busy) / 3.0


#: The transfer time critical_transfers runs the order with: small against a chunk's time, so no transfer
#: turns into a wait that was not one.
_PROBE_TRANSFER = 1e-3


def critical_transfers(pp: int, vpp: int, m: int, round_size: int = 0) -> float:
    """How many chunk-to-chunk transfers a step of the schedule waits on when they overlap with compute
    (run_schedule's transfer term): the makespan's growth per second of transfer time, every chunk equal
    (backward twice the forward). For Megatron-LM's interleaved orders it is 2 (pp vpp - 1), the path through
    every model chunk forward and back, whatever the micro-batch count (tests/workbench/planner/
    test_planner_schedule.py); the transfers of the other micro-batches hide under compute."""
    slow, _ = _unit_run(pp, vpp, m, round_size, _PROBE_TRANSFER)
    fast, _ = _unit_run(pp, vpp, m, round_size, 0.0)
    return round((slow - fast) / _PROBE_TRANSFER, 6)


def grad_sync_launches(pp: int, vpp: int, m: int, rank: int) -> tuple[float, list[float]]:
    """Megatron-LM's interleaved order run with unit times (a stage's forward 1 and backward 2 per
    micro-batch): (makespan, the times rank `rank` launches each model chunk's gradient reduction, sorted).
    With overlap_grad_reduce and align_grad_reduce (Megatron-LM's defaults with interleaving) a chunk's
    reduction is launched as a whole after the backward that comes `rank` backwards after the chunk's last one
    (so every rank launches at the same step of the schedule), or at the end of the rank's order
    (megatron/core/pipeline_parallel/schedules.py, grad_sync_func). The reference that
    interleaved_reduce_exposed's closed form is tested against."""
    ends: dict[tuple[str, int, int], float] = {}
    fwd = [[1.0 / vpp] * vpp for _ in range(pp)]
    span, _ = run_schedule(pp, vpp, m, fwd, [[2.0 * t for t in row] for row in fwd], ends=ends)
    backwards = [(i, k) for forward, i, k in _order(pp, vpp, m, rank) if not forward]
    finish = [ends[("B", i, k * pp + rank)] for i, k in backwards]
    last = {k: max(j for j, (_, kk) in enumerate(backwards) if kk == k) for k in range(vpp)}
    return span, sorted(finish[min(last[k] + rank, len(finish) - 1)] for k in range(vpp))


def interleaved_reduce_exposed(pp: int, vpp: int, chunk_s: float, chunk_bwd_s: float) -> float:
    """Seconds the gradient reductions of Megatron-LM's interleaved schedule run past the step's compute,
    each of the vpp chunks' reductions taking chunk_s on one stream and a chunk's backward of one
    micro-batch chunk_bwd_s: rank 0 (the last to finish, tests/workbench/planner/test_planner_schedule.py)
    launches its chunks' reductions pp backwards apart, the last one at the end (grad_sync_launches), so
    max over j < vpp of (j + 1) chunk_s - j pp chunk_bwd_s: one chunk's reduction when each fits in the
    gap, all of them less the gaps when the stream falls behind."""
    gap = pp * chunk_bwd_s
    return max((j + 1) * chunk_s - j * gap for j in range(vpp))


def interleaved_gather_exposed(pp: int, vpp: int, chunk_s: float, chunk_fwd_s: float, first_s: float) -> float:
    """Seconds the next step's forward waits on the parameter all-gathers of Megatron-LM's interleaved
    schedule (overlap_param_gather, align_param_gather): chunks 0 and 1 are gathered from the start, chunk
    c >= 2 from the first forward of chunk c - 1, one after another on one stream, chunk_s each; chunk c's
    first forward on rank 0 starts c pp chunk_fwd_s in (pp forwards of each earlier chunk); first_s: what the
    first chunk's gather exposes bucket by bucket under its own first forward (bucketed_exposed_s). The
    forwards slip by the largest lateness so far."""
    delay, free = first_s, chunk_s
    for c in range(1, vpp):
        release = 0.0 if c == 1 else (c - 1) * pp * chunk_fwd_s + delay
        free = max(release, free) + chunk_s
        delay = max(delay, free - c * pp * chunk_fwd_s)
    return delay


def _prefix(n: int, size: int, vpp: int) -> tuple[int, ...]:
    """Per chunk, how many of the first n forwards (in schedule order, rounds of `size`) ran on it."""
    group = size * vpp
    return tuple((n // group) * size + min(size, max(0, n % group - k * size)) for k in range(vpp))


def live_counts(pp: int, vpp: int, m: int, rank: int, round_size: int = 0) -> list[tuple[int, ...]]:
    """The live sets after each forward of `rank` that no other contains, as per-chunk micro-batch
    counts; the peak for per-chunk bytes w is the largest dot product (peak).

    After forward j the first j+1 forwards and the first max(0, j - warm-up) backwards have run (_order);
    both are prefixes of a fixed order, so the counts per chunk are closed-form; the warm-up only adds,
    and past it one group of pp*vpp forwards repeats the same live sets, so only the end of the warm-up
    and one group after it are evaluated. round_size: N micro-batches per round (0: pp; module docstring)."""
    n = round_size or pp
    if vpp > 1 and m % n:
        raise ValueError(f"the interleaved schedule needs micro-batches ({m}) divisible by the round size ({n})")
    warm = _warmup(pp, vpp, m, rank, n)
    rows = set()
    for j in range(max(0, warm - 1), min(m * vpp, warm + n * vpp)):  # the warm-up only adds: its last set
        fwd, bwd = _prefix(j + 1, n, vpp), _prefix(max(0, j - warm), n, vpp)[::-1]  # backwards: chunks reversed
        rows.add(tuple(f - b for f, b in zip(fwd, bwd, strict=True)))
    return _undominated(rows)  # a live set another holds chunk by chunk can never be the peak


def schedule_live_counts(pp: int, vpp: int, m: int, rank: int, memo: dict[tuple[Any, ...], Any] | None = None,
                         round_size: int = 0) -> list[tuple[int, ...]]:
    """live_counts, memoised on (pp, vpp, m, rank, round_size)."""
    key = ("live", pp, vpp, m, rank, round_size)
    if memo is not None and key in memo:
        out: list[tuple[int, ...]] = memo[key]
        return out
    out = live_counts(pp, vpp, m, rank, round_size)
    if memo is not None:
        memo[key] = out
    return out


def chunk_first_layer(n_layers: int, pp: int, vpp: int) -> list[list[int]]:
    """first[r][k]: the model's index of the first layer of virtual stage k on rank r (for a MoE model's
    leading dense layers)."""
    layers = chunk_layers(n_layers, pp, vpp)
    starts, at = {}, 0
    for g in range(pp * vpp):
        starts[g] = at
        at += layers[g % pp][g // pp]
    return [[starts[k * pp + r] for k in range(vpp)] for r in range(pp)]


def candidate_ranks(layers: list[list[int]]) -> list[int]:
    """The ranks whose peak can be the largest: the first rank of each distinct chunk pattern, plus the
    last rank (it holds the output layer). Among ranks with the same chunks a lower rank warms up more
    forwards, and its live set after each forward contains the higher rank's, so its peak is no lower."""
    seen, out = set(), []
    for r, pattern in enumerate(layers):
        key = (tuple(pattern), r == 0)
        if key not in seen:
            seen.add(key)
            out.append(r)
    if len(layers) - 1 not in out:
        out.append(len(layers) - 1)
    return out


def peak(rows: list[tuple[int, ...]], chunk_bytes: list[float]) -> tuple[float, int]:
    """(largest live bytes, the most micro-batches live on one chunk at that moment)."""
    if min(chunk_bytes) == max(chunk_bytes):  # even chunks: the most chunk activations live
        top = max(rows, key=sum)
        return float(sum(top) * chunk_bytes[0]), max(top)
    if len(rows[0]) != len(chunk_bytes):  # every live set has one count per chunk
        raise ValueError(f"live sets of {len(rows[0])} chunks against {len(chunk_bytes)} chunk sizes")
    best = max(rows, key=lambda row: sum(map(mul, row, chunk_bytes)))
    return float(sum(map(mul, best, chunk_bytes))), max(best)
