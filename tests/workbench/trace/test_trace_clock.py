"""Exact clocks: decimal text to integer nanoseconds at any magnitude; breakdowns exact at epoch clocks."""

from __future__ import annotations

import random
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pytest

from wavefront.workbench.trace import load_trace
from wavefront.workbench.trace.breakdown import CATEGORIES, step_breakdowns
from wavefront.workbench.trace.clock import ClockValueError, ns_column, us_text_to_ns
from wavefront.workbench.trace.testing import PLANTED_STEP1_US as STEP1
from wavefront.workbench.trace.testing import PLANTED_STEP2_US as STEP2
from wavefront.workbench.trace.testing import SynthTrace, planted_gpu_trace

EPOCH_US = 1_760_000_000_000_000  # 2025-10 on the Unix clock, in microseconds


def _exact(text: str) -> int:
    return int((Decimal(text) * 1000).to_integral_value(ROUND_HALF_EVEN))


def _texts(rng: random.Random, n: int) -> list[str]:
    forms = [
        lambda: str(rng.randrange(EPOCH_US, EPOCH_US + 10**12)),  # whole us at epoch scale
        lambda: f"{rng.randrange(EPOCH_US, EPOCH_US + 10**12)}.{rng.randrange(1000):03d}",  # ns resolution
        lambda: f"{rng.randrange(10**6)}.{rng.randrange(10):d}",  # one decimal
        lambda: f"-{rng.randrange(10**6)}.{rng.randrange(100):02d}",
        lambda: f"{rng.randrange(10**6)}.{rng.randrange(10**6):06d}",  # picoseconds: rounds half to even
        lambda: f"{rng.random() * 1e6:.4e}",  # exponent
        lambda: repr(rng.random() * 1e3),  # Python float text
    ]
    return [rng.choice(forms)() for _ in range(n)]


@pytest.mark.parametrize("only_plain", [True, False])
def test_ns_column_is_exact(only_plain):
    texts = _texts(random.Random(7), 5000)
    if only_plain:  # the vectorized path: digits, one dot, a minus
        texts = [t for t in texts if "e" not in t and len(t.partition(".")[2]) <= 3]
    got = ns_column(",".join(texts).encode(), len(texts))
    assert got.dtype == np.int64
    assert got.tolist() == [_exact(t) for t in texts]


def test_scalar_edge_cases():
    assert us_text_to_ns("1760000000000000.123") == 1_760_000_000_000_000_123
    assert us_text_to_ns("0.0005") == 0 and us_text_to_ns("0.0015") == 2  # half to even
    assert us_text_to_ns("1.5e3") == 1_500_000 and us_text_to_ns('"12.5"') == 12_500
    assert ns_column(b"-0.5,7", 2).tolist() == [-500, 7000]
    for bad in ("", "soon", "1.2.3", "nan", "1e40"):
        with pytest.raises(ClockValueError):
            ns_column(bad.encode(), 1)


def test_float_parsing_would_not_be_exact():
    """The reason for all this: through float64, an epoch-scale ns timestamp moves by up to 128 ns."""
    texts = [f"{EPOCH_US + k}.{k * 37 % 1000:03d}" for k in range(1000)]
    via_float = np.rint(np.array([float(t) for t in texts]) * 1000.0).astype(np.int64)
    exact = ns_column(",".join(texts).encode(), len(texts))
    assert np.any(via_float != exact)
    assert exact.tolist() == [int(t.replace(".", "")) for t in texts]


@pytest.mark.parametrize(("base", "whole_us"), [(str(EPOCH_US), True), (f"{EPOCH_US}.123", False),
                                                (f"{EPOCH_US}.999", False)])
@pytest.mark.parametrize("streaming", [False, True])
def test_planted_breakdown_exact_at_epoch_clocks(tmp_path, base, whole_us, streaming):
    path = planted_gpu_trace(base_us=base, whole_us=whole_us).write(tmp_path / "epoch.json")
    if streaming:
        from wavefront.workbench.trace.load import _load_streaming

        trace = _load_streaming(path, None, None)
    else:
        trace = load_trace(path)
    assert int(trace.device.ts_ns.min()) == _exact(base) + 100_000
    steps, _ = step_breakdowns(trace)
    for s, expected in zip(steps, (STEP1, STEP2), strict=True):
        assert s.dur_ns == 1_000_000 and s.total_ns() == s.dur_ns
        assert {c: s.ns(c) for c in CATEGORIES} == {c: v * 1000 for c, v in expected.items()}


def test_nanosecond_pieces_at_epoch_clock(tmp_path):
    """Kernels 1 ns apart at an epoch clock: every nanosecond lands in the right category."""
    t = SynthTrace(base_us=f"{EPOCH_US}.000")
    t.step(1, 0, 1.0)  # a 1000 ns step
    t.launch("k_compute", 0.001, 0.4, launch_ts=0)  # [1, 401) ns
    comm = t.op("nccl:all_reduce", 0, 0.001)
    t.launch("ncclDevKernel_AllReduce", 0.4, 0.3, launch_ts=0, stream=20, op=comm)  # [400, 700) ns
    (s,), _ = step_breakdowns(load_trace(t.write(tmp_path / "ns.json")))
    assert (s.compute_ns, s.comm_overlapped_ns, s.comm_exposed_ns) == (399, 1, 299)
    assert s.idle_ns == 1 + 300 and s.total_ns() == 1000
