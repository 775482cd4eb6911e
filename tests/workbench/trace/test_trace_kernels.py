"""Kernel table, FLOP/byte formulas and roofline placement."""

from __future__ import annotations

import numpy as np
import pytest

from wavefront.workbench.trace import analyze, load_trace
from wavefront.workbench.trace.flops import op_cost
from wavefront.workbench.trace.kernels import top_level_cpu_ops
from wavefront.workbench.trace.testing import planted_gpu_trace

BF16 = "c10::BFloat16"


def test_kernel_and_family_tables(planted_path):
    k = analyze([planted_path]).ranks[0].kernels
    assert k.domain == "device"
    graph = next(f for f in k.families if f.name == "triton_poi_fused_graph")
    assert (graph.count, graph.total_us, graph.median_us, graph.max_us) == (3, 290.0, 100.0, 100.0)
    assert graph.mean_us == pytest.approx(290 / 3)
    assert graph.p90_us == pytest.approx(100.0)
    assert sum(f.share for f in k.families) == pytest.approx(1.0)
    assert sum(f.total_us for f in k.families) == 1500.0  # every device event once, durations summed
    assert k.families[0].name == "nccl AllReduce" and k.families[0].cls == "comm"


def test_roofline_exact_on_h100(tmp_path):
    r = analyze([planted_gpu_trace().write(tmp_path / "p.json")]).ranks[0]
    assert r.kernels.gpu == "h100"
    mm = next(p for p in r.kernels.roofline if p.op == "aten::mm")
    assert mm.flops == 2 * 64 * 128 * 256
    assert mm.bytes_moved == 2 * (64 * 128 + 128 * 256 + 64 * 256)
    assert mm.median_us == 200.0 and mm.count == 1
    assert mm.achieved_tflops == pytest.approx(mm.flops / 200e-6 / 1e12)
    assert mm.attainable_tflops == pytest.approx(mm.intensity * 3.35)  # below the 989.4 TFLOP/s roof
    assert mm.bound == "memory"
    assert mm.pct_of_roof == pytest.approx(100 * mm.achieved_tflops / mm.attainable_tflops)


def test_device_override_and_unknown_device(tmp_path):
    p = planted_gpu_trace(device_name="NVIDIA L4").write(tmp_path / "l4.json")
    r = analyze([p]).ranks[0]
    assert r.kernels.gpu is None
    assert any("not in the device table" in n for n in r.kernels.notes)
    assert r.kernels.roofline and all(x.attainable_tflops is None for x in r.kernels.roofline)
    assert r.steps[0].us("compute") == 400  # the rest of the analysis is unaffected
    r2 = analyze([p], device="mi300x").ranks[0]
    mm = next(x for x in r2.kernels.roofline if x.op == "aten::mm")
    assert r2.kernels.gpu == "mi300x" and mm.attainable_tflops == pytest.approx(mm.intensity * 5.3)


@pytest.mark.parametrize(("name", "dims", "types", "flops", "nbytes"), [
    ("aten::addmm", [[256], [32, 64], [64, 256]], ["float"] * 3, 2 * 32 * 64 * 256 + 32 * 256,
     4 * (256 + 32 * 64 + 64 * 256 + 32 * 256)),
    ("aten::bmm", [[4, 8, 16], [4, 16, 32]], [BF16] * 2, 2 * 4 * 8 * 16 * 32, 2 * 4 * (8 * 16 + 16 * 32 + 8 * 32)),
    ("aten::linear", [[2, 8, 64], [128, 64], [128]], [BF16] * 3, 2 * 16 * 64 * 128 + 16 * 128,
     2 * (2 * 8 * 64 + 128 * 64 + 16 * 128 + 128)),
    ("aten::_scaled_dot_product_flash_attention", [[2, 4, 128, 64]] * 3, [BF16] * 3, 4 * 2 * 4 * 128 * 128 * 64,
     2 * 4 * 2 * 4 * 128 * 64),
    ("aten::add", [[8, 1], [1, 16], []], ["float", "float", "Scalar"], 128, 4 * (8 + 16 + 128)),
    ("aten::mul_", [[8, 16], [16]], [BF16, BF16], 128, 2 * (128 + 16 + 128)),
    ("aten::_softmax", [[4, 1000], [], []], ["float", "Scalar", "Scalar"], 5 * 4000, 4 * 2 * 4000),
])
def test_op_cost(name, dims, types, flops, nbytes):
    cost = op_cost(name, dims, types)
    assert cost is not None and (cost.flops, cost.bytes_moved) == (flops, nbytes)


def test_op_cost_rejects_what_it_does_not_understand():
    assert op_cost("aten::mm", [[4, 5], [6, 7]], ["float", "float"]) is None  # inner dims disagree
    assert op_cost("aten::conv2d", [[1, 3, 8, 8]], ["float"]) is None
    assert op_cost("aten::mm", [[], []], ["Scalar", "Scalar"]) is None


def test_cpu_only_table_counts_top_level_ops_once(data_dir):
    trace = load_trace(data_dir / "cpu_train_h64.json.gz")
    rows = top_level_cpu_ops(trace)
    cpu = trace.cpu
    for tid in np.unique(cpu.tid[rows]).tolist():
        sel = rows[cpu.tid[rows] == tid]
        assert np.all(cpu.ts_ns[sel][1:] >= cpu.end_ns[sel][:-1])  # no overlap: nothing counted twice
    k = analyze([data_dir / "cpu_train_h64.json.gz"]).ranks[0].kernels
    assert k.domain == "cpu" and k.roofline == []
    assert any(f.name == "aten::linear" and f.count == 40 for f in k.families)  # 2 linears x 20 steps
