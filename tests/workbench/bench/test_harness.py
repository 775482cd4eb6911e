"""The harness on CPU: every mode builds and times, baselines agree with eager, failures are recorded.

CPU samples are Triton-interpreter wall times: correctness runs, not performance figures.
"""

from __future__ import annotations

import pytest
import torch

from wavefront.ops import REGISTRY
from wavefront.workbench.bench.harness import BenchConfig, Harness, plan
from wavefront.workbench.bench.model import achieved, model_case
from wavefront.workbench.bench.providers import LIGER, ProviderSet, Unavailable
from wavefront.workbench.bench.runnable import formula, prepare
from wavefront.workbench.hardware import get_gpu

TINY = BenchConfig(ops=("rms_norm",), case_set="small", case_names=("npow2",), reps=3, warmup=1,
                   providers=("wavefront", "eager", "liger"), dtypes=(torch.float32,))


def test_plan_covers_registry_modes_and_filters():
    items = plan(BenchConfig())
    assert {i.spec.name for i in items} == set(REGISTRY)
    assert {i.mode for i in items} == {"fwd", "bwd", "fwd_bwd"}
    assert all(i.dtype == torch.bfloat16 for i in items)
    assert all(i.case in i.spec.bench_cases for i in items)
    assert [i.label for i in plan(TINY)] == ["rms_norm/npow2/fwd/fp32", "rms_norm/npow2/bwd/fp32",
                                             "rms_norm/npow2/fwd_bwd/fp32"]


def test_plan_on_a_gpu_keeps_only_the_cases_that_compile_for_it():
    from wavefront import runtime

    everywhere = plan(BenchConfig(ops=("quantize", "rms_norm", "linear_fp8")))
    a100 = plan(BenchConfig(ops=("quantize", "rms_norm", "linear_fp8")), runtime.get_arch("sm_80"))
    h100 = plan(BenchConfig(ops=("quantize", "rms_norm", "linear_fp8")), runtime.get_arch("sm_90"))
    assert {i.spec.name for i in a100} == {"rms_norm"}  # no FP8 op on Ampere
    assert any("fp8" in i.case.name for i in everywhere if i.spec.name == "rms_norm")
    assert not any("fp8" in i.case.name for i in a100)  # the fused-FP8 norm cases neither
    assert any(i.spec.name == "linear_fp8" for i in h100) and not any("fnuz" in i.case.name for i in h100)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="mode must be one of"):
        BenchConfig(modes=("sideways",))
    with pytest.raises(ValueError, match="provider must be one of"):
        BenchConfig(providers=("numpy",))
    with pytest.raises(ValueError, match="unknown op"):
        BenchConfig(ops=("nope",))


def test_cpu_run_times_every_mode_and_records_unavailable_baselines():
    rows = [m for batch in Harness(TINY, "cpu").run() for m in batch]
    assert len(rows) == 9
    for m in rows:
        if m.provider == "liger":
            assert m.status == "unavailable" and "GPU" in m.reason
            continue
        assert m.ok, m.reason
        assert len(m.samples_us) == 3 and m.method == "wall" and m.n_warmup == 1
        assert m.max_diff_vs_eager is not None and m.max_diff_vs_eager < 1e-4
        assert m.gbps is None  # no rates from CPU wall times
        flops, n_bytes = formula(REGISTRY["rms_norm"], REGISTRY["rms_norm"].cases[1], torch.float32, m.mode)
        assert (m.flops, m.min_bytes) == (flops, n_bytes)


def test_a_failing_provider_is_recorded_and_the_run_goes_on(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(ProviderSet, "_resolve", lambda self, p, spec: broken if p == "eager" else spec.fn)
    rows = Harness(TINY, "cpu").run_item(plan(TINY)[0])
    by = {m.provider: m for m in rows}
    # eager is also the cross-check: its failure shows up as an input error for every provider
    assert by["eager"].status == "error" and "kernel exploded" in by["eager"].reason


def test_budget_marks_the_rest_skipped():
    cfg = BenchConfig(**{**TINY.__dict__, "budget_s": 0.0})
    batches = list(Harness(cfg, "cpu").run())
    assert batches[0][0].status == "ok"  # the budget is checked before each item; the first always runs
    assert all(m.status == "skipped" and "budget" in m.reason for b in batches[1:] for m in b)


def test_backward_timed_call_reuses_one_forward():
    spec = REGISTRY["softmax"]
    case = spec.cases[1]
    gen = torch.Generator().manual_seed(0)
    inputs = spec.make_inputs(case, torch.float32, torch.device("cpu"), gen)
    calls = {"n": 0}

    def counting(x):
        calls["n"] += 1
        return spec.eager_fn(x)

    r = prepare(counting, inputs, "bwd", gen)
    n0 = calls["n"]
    (dx,) = r.call()
    (dx2,) = r.call()
    assert calls["n"] == n0  # the timed backward never reruns the forward
    assert torch.equal(dx, dx2) and dx.shape == inputs.args[0].shape
    with pytest.raises(ValueError, match="mode must be one of"):
        prepare(counting, inputs, "sideways", gen)


def test_modeled_roofline_math():
    spec = REGISTRY["rms_norm"]
    case = spec.bench_cases[0]
    h100 = get_gpu("h100")
    m = model_case(spec, case, torch.bfloat16, "fwd", h100)
    flops, n_bytes = formula(spec, case, torch.bfloat16, "fwd")
    assert m.bound == "memory"
    assert m.attainable_us == pytest.approx(n_bytes / 3.35e12 * 1e6)
    assert m.intensity == pytest.approx(flops / n_bytes)
    fb = model_case(spec, case, torch.bfloat16, "fwd_bwd", h100)
    assert fb.min_bytes == n_bytes + spec.min_bytes(case, torch.bfloat16, "bwd")


def test_achieved_rates():
    h100 = get_gpu("h100")
    r = achieved(1e9, 3_350_000_000, 1000.0, h100, "bf16", 4000.0)
    assert r["gbps"] == pytest.approx(3350.0)
    assert r["pct_peak_bw"] == pytest.approx(100.0)
    assert r["pct_copy_bw"] == pytest.approx(83.75)
    assert r["tflops"] == pytest.approx(1.0)
    assert r["pct_peak_flops"] == pytest.approx(100 / 989.4)
    with pytest.raises(ValueError, match="median_us"):
        achieved(1, 1, 0.0, h100, "bf16", None)


def test_liger_table_maps_registered_ops_only():
    assert set(LIGER) <= set(REGISTRY)
    got = ProviderSet(torch.device("cpu")).resolve("liger", REGISTRY["rms_norm"])
    assert isinstance(got, Unavailable)


class _FakeFlusher:
    n_bytes = 64 << 20
    label = "flush 64 MiB"

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def _gpu_harness(monkeypatch, threshold_us):
    """The GPU code path driven on CPU: wall clock instead of events, a counting flusher, no CUDA memory."""
    from wavefront.workbench.bench import harness as H
    from wavefront.workbench.bench import timer as T

    flusher = _FakeFlusher()
    ctx = H.GpuContext(flusher, get_gpu("h100"), copy_gbps=4000.0, clock_factory=T.WallClock)
    monkeypatch.setattr(H.Harness, "_peak_memory", lambda self, call: 12345)
    cfg = BenchConfig(ops=("softmax",), case_set="small", case_names=("rows_pow2",), modes=("fwd",), reps=30,
                      warmup=1, providers=("eager",), dtypes=(torch.float32,), graph_threshold_us=threshold_us)
    return H.Harness(cfg, "cpu", gpu_ctx=ctx), flusher


def test_gpu_path_times_with_flush_and_computes_rates(monkeypatch):
    harness, flusher = _gpu_harness(monkeypatch, threshold_us=0.0)  # nothing counts as short: events path
    (m,) = harness.run_item(plan(harness.config)[0])
    assert m.ok and len(m.samples_us) == 30 and m.flush == "flush 64 MiB" and m.reason == ""
    assert flusher.calls == 5 + 30  # the estimate's repetitions and the real ones, each after a flush
    assert m.peak_mem_bytes == 12345
    assert m.gbps == pytest.approx(m.min_bytes / (m.median_us * 1e-6) / 1e9)
    assert m.pct_copy_bw == pytest.approx(100 * m.gbps / 4000.0)
    assert m.pct_peak_bw == pytest.approx(100 * m.gbps / 3350.0)


def test_short_kernels_use_graph_replay_over_rotated_inputs(monkeypatch):
    from wavefront.workbench.bench import timer as T

    captured = {}

    class FakeGraph:
        def __init__(self, calls):
            captured["n"] = len(calls)
            self.calls = calls

        def replay(self):
            for c in self.calls:
                c()

    monkeypatch.setattr(T, "capture_cuda_graph", FakeGraph)
    harness, _ = _gpu_harness(monkeypatch, threshold_us=1e12)  # everything counts as short
    (m,) = harness.run_item(plan(harness.config)[0])
    assert m.ok and m.method == "graph" and m.flush.startswith("rotation ")
    n_sets = int(m.flush.split()[1])
    assert m.calls_per_sample == captured["n"] == n_sets >= 2


def test_graph_capture_failure_falls_back_to_events(monkeypatch):
    from wavefront.workbench.bench import timer as T

    def no_graphs(calls):
        raise RuntimeError("capture not supported")

    monkeypatch.setattr(T, "capture_cuda_graph", no_graphs)
    harness, flusher = _gpu_harness(monkeypatch, threshold_us=1e12)
    (m,) = harness.run_item(plan(harness.config)[0])
    assert m.ok and m.method == "wall" and m.calls_per_sample == 1
    assert "graph capture failed (RuntimeError); timed with events" in m.reason
    assert flusher.calls == 5 + 30


@pytest.mark.parametrize("op", sorted(LIGER))
def test_liger_adapters_accept_every_registered_case_signature(op):
    """Each adapter takes our op's arguments (as the registry makes them) and hands Liger's Function its
    positional order; a stand-in Function records the call (Liger itself runs on GPUs only)."""
    calls = []

    class FakeFunction:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return args[0]

    spec = REGISTRY[op]
    adapter = LIGER[op][2](FakeFunction)
    tried = 0
    for case in spec.cases[:4]:
        inputs = spec.make_inputs(case, torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
        try:
            adapter(*inputs.args, **inputs.kwargs)
        except NotImplementedError:
            continue  # a case Liger cannot express (reported as unavailable by the harness)
        tried += 1
        assert calls[-1][0] is inputs.args[0], "the first tensor goes first"
    assert tried, f"no case of {op} reached Liger's Function"
