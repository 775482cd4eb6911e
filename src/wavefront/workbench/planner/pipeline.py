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
takes micro-batches in groups of pp per chunk (forward k is chunk (k mod pp*vpp) // pp of micro-batch
(k // (pp*vpp)) pp + k mod pp; backwards run the chunks in reverse) with min(2 (pp - r - 1) +
(vpp - 1) pp, m vpp) warm-up forwards. A forward makes its (micro-batch, chunk) activations live, its
backward frees them; the peak is the largest live set after a forward. ZB-H1 keeps 1F1B's order of
forwards and backwards for the activations (the split-off weight gradients hold no more), so it uses
1F1B's counts. The counts are per chunk, so uneven chunks weigh in exactly.
"""

from __future__ import annotations

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


def _warmup(pp: int, vpp: int, m: int, rank: int) -> int:
    return min(pp - rank - 1, m) if vpp == 1 else min(2 * (pp - rank - 1) + (vpp - 1) * pp, m * vpp)


def _order(pp: int, vpp: int, m: int, rank: int) -> list[tuple[bool, int, int]]:
    """(is_forward, micro-batch, chunk) in the order rank `rank` runs them (the reference that
    live_counts' closed form is tested against)."""
    total, group = m * vpp, pp * vpp

    def op(forward: bool, k: int) -> tuple[bool, int, int]:
        chunk = (k % group) // pp
        return forward, (k // group) * pp + k % pp, chunk if forward else vpp - 1 - chunk

    warm = _warmup(pp, vpp, m, rank)
    ops = [op(True, k) for k in range(warm)]
    for i in range(total - warm):
        ops += [op(True, warm + i), op(False, i)]
    return ops + [op(False, k) for k in range(total - warm, total)]


def _prefix(n: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Per chunk, how many of the first n forwards (in schedule order) ran on it."""
    group = pp * vpp
    return tuple((n // group) * pp + min(pp, max(0, n % group - k * pp)) for k in range(vpp))


def live_counts(pp: int, vpp: int, m: int, rank: int) -> list[tuple[int, ...]]:
    """The live sets after each forward of `rank` that no other contains, as per-chunk micro-batch
    counts; the peak for per-chunk bytes w is the largest dot product (peak).

    After forward j the first j+1 forwards and the first max(0, j - warm-up) backwards have run (_order);
    both are prefixes of a fixed order, so the counts per chunk are closed-form; the warm-up only adds,
    and past it one group of pp*vpp forwards repeats the same live sets, so only the end of the warm-up
    and one group after it are evaluated."""
    if vpp > 1 and m % pp:
        raise ValueError(f"the interleaved schedule needs micro-batches ({m}) divisible by pp ({pp})")
    warm = _warmup(pp, vpp, m, rank)
    rows = set()
    for j in range(max(0, warm - 1), min(m * vpp, warm + pp * vpp)):  # the warm-up only adds: its last set
        fwd, bwd = _prefix(j + 1, pp, vpp), _prefix(max(0, j - warm), pp, vpp)[::-1]  # backwards: chunks reversed
        rows.add(tuple(f - b for f, b in zip(fwd, bwd, strict=True)))
    # a live set that another holds chunk by chunk can never be the peak (bytes are >= 0): drop it
    return sorted(r for r in rows if not any(o != r and all(a >= b for a, b in zip(o, r, strict=True))
                                             for o in rows))


def schedule_live_counts(pp: int, vpp: int, m: int, rank: int,
                         memo: dict[tuple[Any, ...], Any] | None = None) -> list[tuple[int, ...]]:
    """live_counts, memoised on (pp, vpp, m, rank)."""
    key = ("live", pp, vpp, m, rank)
    if memo is not None and key in memo:
        out: list[tuple[int, ...]] = memo[key]
        return out
    out = live_counts(pp, vpp, m, rank)
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
    best = max(rows, key=lambda row: sum(c * w for c, w in zip(row, chunk_bytes, strict=True)))
    return float(sum(c * w for c, w in zip(best, chunk_bytes, strict=True))), max(best)
