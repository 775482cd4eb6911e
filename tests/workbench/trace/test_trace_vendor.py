"""What Nsight Systems exports and rocprofv3 CSV traces share: the same timeline gives the same exact
breakdown as its torch.profiler JSON, steps by name, collectives by kernel name, no annotated copies."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.trace import load_trace
from wavefront.workbench.trace.breakdown import step_breakdowns
from wavefront.workbench.trace.classify import COMM, REASONS, classify_device
from wavefront.workbench.trace.testing import (
    PLANTED_STEP1_US,
    SynthTrace,
    planted_gpu_trace,
    write_nsys_sqlite,
    write_rocprof_csv,
)

# format -> (the vendor whose names the planted trace uses, a writer of that timeline into a folder, source)
FORMATS = {
    "nsys": ("nvidia", lambda trace, folder: write_nsys_sqlite(trace, folder / "t.sqlite"), "nsys"),
    "rocprof": ("amd", lambda trace, folder: write_rocprof_csv(trace, folder / "roc"), "rocprofv3"),
}
COLLECTIVE_KERNELS = {"nsys": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                      "rocprof": "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"}  # RCCL on ROCm 6.x


def _run(*args):
    return CliRunner().invoke(build_app(), ["trace", *map(str, args)])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("base_us", [1_000_000, "1760000000000000.123"])
def test_same_timeline_same_breakdown(tmp_path, fmt, base_us):
    vendor, write, source = FORMATS[fmt]
    synth = planted_gpu_trace(vendor, base_us=base_us)
    kineto = load_trace(synth.write(tmp_path / "p.json.gz"))
    vendor_trace = load_trace(write(synth, tmp_path))
    assert vendor_trace.meta["source"] == source and vendor_trace.warnings == []
    a, _ = step_breakdowns(kineto)
    b, _ = step_breakdowns(vendor_trace)
    assert [s.step for s in b] == [1, 2]
    assert a == b  # every integer-nanosecond field of every step
    assert {c: b[0].ns(c) for c in PLANTED_STEP1_US} == {c: v * 1000 for c, v in PLANTED_STEP1_US.items()}
    ck, cv = classify_device(kineto), classify_device(vendor_trace)
    assert ck.cls.tolist() == cv.cls.tolist() and ck.reason.tolist() == cv.reason.tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_step_pattern_option(tmp_path, fmt):
    t = SynthTrace(vendor=FORMATS[fmt][0])
    for n, start in ((3, 0), (4, 500)):
        t.op(f"train_step {n}", start, 400, cat="user_annotation")
        t.launch("triton_poi_fused_add_0", start + 100, 200, launch_ts=start + 10)
    path = FORMATS[fmt][1](t, tmp_path)
    steps, notes = step_breakdowns(load_trace(path))
    assert [s.step for s in steps] == [None] and "no ProfilerStep markers" in notes[0]
    steps, _ = step_breakdowns(load_trace(path, step_pattern=r"^train_step (\d+)$"))
    assert [(s.step, s.dur_ns, s.compute_ns) for s in steps] == [(3, 400_000, 200_000), (4, 400_000, 200_000)]
    unnumbered, _ = step_breakdowns(load_trace(path, step_pattern="^train_step"))
    assert [s.step for s in unnumbered] == [1, 2]
    res = _run("analyze", path, "--step-pattern", r"^train_step (\d+)$", "--json", "-")
    assert res.exit_code == 0, res.output
    assert [s["step"] for s in json.loads(res.stdout)["ranks"][0]["steps"]] == [3, 4]
    bad = _run("analyze", path, "--step-pattern", "train_step (")
    assert bad.exit_code == 2 and "step_pattern" in bad.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_collective_kernel_is_communication_by_name(tmp_path, fmt):
    """No host range launches it: the NCCL/RCCL kernel name alone classifies it, as on the torch.profiler path."""
    vendor = FORMATS[fmt][0]
    t = SynthTrace(vendor=vendor)
    t.launch(COLLECTIVE_KERNELS[fmt], 100, 300, launch_ts=10, stream=20)
    t.launch(t.v["gemm"], 200, 100, launch_ts=20)
    trace = load_trace(FORMATS[fmt][1](t, tmp_path))
    classes = classify_device(trace)
    names = trace.name_of(trace.device.name)
    row = names.index(COLLECTIVE_KERNELS[fmt])
    assert classes.cls[row] == COMM and REASONS[classes.reason[row]] == "name"
    (step,), _ = step_breakdowns(trace)
    assert (step.compute_ns, step.comm_overlapped_ns, step.comm_exposed_ns) == (0, 100_000, 200_000)


@pytest.mark.parametrize("fmt", FORMATS)
def test_annotate_refuses_and_leaves_nothing(tmp_path, fmt):
    (tmp_path / "in").mkdir()
    path = FORMATS[fmt][1](planted_gpu_trace(FORMATS[fmt][0]), tmp_path / "in")
    res = _run("analyze", path, "--annotate", tmp_path / "out.json.gz")
    assert res.exit_code == 2 and "JSON traces only" in " ".join(res.output.split())
    assert not (tmp_path / "out.json.gz").exists()
