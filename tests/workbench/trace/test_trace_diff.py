"""Statistical trace diffs: planted changes, zeros, too few steps, real traces."""

from __future__ import annotations

import random

from wavefront.workbench.trace import analyze, diff
from wavefront.workbench.trace.diff import compare_samples
from wavefront.workbench.trace.testing import SynthTrace


def _trace(path, *, n_steps, compute_us, seed, comm_us=0.0):
    rng = random.Random(seed)
    t = SynthTrace()
    for k in range(n_steps):
        s = 2000.0 * k
        dur = compute_us + rng.uniform(0, 20)
        t.step(k + 1, s, 1500)
        op = t.op("aten::mul", s + 5, 10)
        t.launch("triton_poi_fused_mul_0", s + 100, dur, launch_ts=s + 10, op=op)
        if comm_us:
            coll = t.op("nccl:all_reduce", s + 20, 10)
            t.launch("ncclDevKernel_AllReduce", s + 100 + dur, comm_us, launch_ts=s + 25, op=coll, stream=20)
    return t.write(path)


def _rows(result):
    return {(r.kind, r.key): r for r in result.rows}


def test_planted_slower_compute(tmp_path):
    a = analyze([_trace(tmp_path / "a.json", n_steps=12, compute_us=400, seed=1)])
    b = analyze([_trace(tmp_path / "b.json", n_steps=12, compute_us=480, seed=2, comm_us=50)])
    rows = _rows(diff(a, b))
    assert rows[("category", "compute")].verdict == "slower"
    assert 1.1 < rows[("category", "compute")].ratio < 1.3
    assert rows[("category", "idle_host_bound")].verdict == "faster"  # the device waits less for the host
    assert rows[("family", "triton_poi_fused_mul")].verdict == "slower"
    assert rows[("step", "step")].verdict == "same"  # every step is 1500 us on both sides
    exposed = rows[("category", "comm_exposed")]  # zero in A, 50 us in B: Mann-Whitney alone
    assert exposed.verdict == "slower" and exposed.ratio is None and "Mann-Whitney" in exposed.note
    assert rows[("category", "memory")].verdict == "same" and "zero" in rows[("category", "memory")].note
    assert rows[("family", "nccl AllReduce")].verdict == "slower"


def test_same_code_is_same(tmp_path):
    a = analyze([_trace(tmp_path / "a.json", n_steps=12, compute_us=400, seed=1)])
    b = analyze([_trace(tmp_path / "b.json", n_steps=12, compute_us=400, seed=1)])
    assert all(r.verdict == "same" for r in diff(a, b).rows)


def test_too_few_steps_is_unknown():
    row = compare_samples("step", "step", [1.0, 1.1, 0.9], [2.0, 2.1, 1.9])
    assert row.verdict == "unknown" and "fewer than" in row.note
    row0 = compare_samples("category", "x", [0.0, 1.0, 0.0], [2.0, 2.1, 0.0])
    assert row0.verdict == "unknown"


def test_real_cpu_traces(data_dir):
    a = analyze([data_dir / "cpu_train_h64.json.gz"])
    b = analyze([data_dir / "cpu_train_h512.json.gz"])
    result = diff(a, b, top=30)
    rows = _rows(result)
    assert result.n_steps_a == result.n_steps_b == 20 and result.domain_a == "cpu"
    # the 8x wider hidden layer makes the matmul families slower in every step
    assert rows[("family", "aten::linear")].verdict == "slower"
    assert rows[("family", "autograd::engine::evaluate_function: AddmmBackward0")].verdict == "slower"
    assert rows[("category", "compute")].verdict == "slower"
    step = rows[("step", "step")]
    assert (step.n_a, step.n_b) == (20, 20) and step.ratio > 1.0  # the wider model's median step is longer
