"""Classification by category, args, launch op, stream, then name; kernel families."""

from __future__ import annotations

import pytest

from wavefront.workbench.trace import load_trace
from wavefront.workbench.trace.classify import CLASS_NAMES, REASONS, classify_device, family
from wavefront.workbench.trace.testing import SynthTrace


def _classes(trace):
    c = classify_device(trace)
    return {trace.names[n]: (CLASS_NAMES[k], REASONS[r]) for n, k, r in
            zip(trace.device.name.tolist(), c.cls.tolist(), c.reason.tolist(), strict=True)}


def test_planted_classes_and_rules(planted_path):
    got = _classes(load_trace(planted_path))
    assert got["fused_collective_kernel_v2"] == ("comm", "launch-op")  # no name pattern would catch it
    assert got["triton_poi_fused_graph_1"] == ("compute", "stream")  # graph kernels kept, linked to a region
    assert got["Memset (Device)"] == ("memset", "category")
    assert got["Memcpy HtoD (Pageable -> Device)"] == ("memcpy", "category")
    comm = [name for name, (cls, _) in got.items() if cls == "comm"]
    assert len(comm) == 2


def test_name_is_only_the_last_resort(tmp_path):
    t = SynthTrace()
    compute_op = t.op("aten::mm", 0, 5)
    # An NCCL-looking name launched by a compute op is compute: the link outranks the name.
    t.launch("ncclLooksLikeCommKernel", 10, 5, launch_ts=1, op=compute_op, stream=3)
    # No link at all: the name decides.
    t.launch("ncclDevKernel_AllGather_RING_LL", 20, 5, launch_ts=2, stream=9)
    t.launch("mystery_kernel", 30, 5, launch_ts=3, stream=11)
    for e in t.events:
        if e.get("cat") in ("kernel", "cuda_runtime") and e["args"].get("correlation", 0) >= 2:
            e["args"].pop("External id", None)
    got = _classes(load_trace(t.write(tmp_path / "n.json")))
    assert got["ncclLooksLikeCommKernel"] == ("compute", "launch-op")
    assert got["ncclDevKernel_AllGather_RING_LL"] == ("comm", "name")
    assert got["mystery_kernel"] == ("compute", "default")


def test_collective_args_on_kernel(tmp_path):
    t = SynthTrace()
    t.launch("brand_new_kernel", 10, 5, launch_ts=1, extra={"Collective name": "allreduce", "Group size": 8})
    got = _classes(load_trace(t.write(tmp_path / "a.json")))
    assert got["brand_new_kernel"] == ("comm", "args")


@pytest.mark.parametrize(("name", "fam"), [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, float)",
     "at::native::vectorized_elementwise_kernel"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl AllReduce"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum_bf16(ncclWorkElem)", "nccl ReduceScatter"),
    ("triton_poi_fused_add_mul_12", "triton_poi_fused_add_mul"),
    ("Memcpy DtoH (Device -> Pinned)", "Memcpy DtoH"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", "GEMM sm90_xmma_gemm"),
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI32x32x8x1_SN", "GEMM Cijk_Alik_Bljk_BBS_BH_MT"),
])
def test_family(name, fam):
    assert family(name) == fam
