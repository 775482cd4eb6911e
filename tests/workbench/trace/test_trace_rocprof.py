"""rocprofv3 CSV traces through the same exact breakdown as torch.profiler traces."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.trace import load_trace
from wavefront.workbench.trace.breakdown import step_breakdowns
from wavefront.workbench.trace.load import TraceLoadError
from wavefront.workbench.trace.model import KIND_MEMSET
from wavefront.workbench.trace.rocprof import group_paths, sniff
from wavefront.workbench.trace.testing import (
    ROCPROF_HEADERS,
    SynthTrace,
    planted_gpu_trace,
    planted_ranks,
    write_rocprof_csv,
)

runner = CliRunner()


def _run(*args):
    return runner.invoke(build_app(), ["trace", *map(str, args)])


def test_memset_kernel_and_device_name(tmp_path):
    """(The breakdown equal to the JSON trace's: test_trace_vendor.py.) hipMemset runs as the runtime's fill
    kernel: memset work, under the kernel's own name; agent_info.csv names the GPU."""
    roc = load_trace(write_rocprof_csv(planted_gpu_trace("amd"), tmp_path / "roc"))
    names = roc.name_of(roc.device.name)
    assert roc.device.kind[names.index("__amd_rocclr_fillBufferAligned")] == KIND_MEMSET
    assert roc.device_name == "AMD Instinct MI300X"


def test_cli_json_matches_kineto(tmp_path):
    synth = planted_gpu_trace("amd")
    docs = []
    for path in (synth.write(tmp_path / "p.json"), write_rocprof_csv(synth, tmp_path / "roc")):
        res = _run("analyze", path, "--json", "-")
        assert res.exit_code == 0, res.output
        docs.append(json.loads(res.stdout)["ranks"][0])
    kineto, roc = docs
    assert roc["steps"] == kineto["steps"] and roc["source"] == "rocprofv3"

    def kernels(doc: dict) -> list[dict]:  # the compute and communication kernels (memory rows differ by name)
        return sorted((r for r in doc["kernels"]["kernels"] if not r["name"].startswith(("Mem", "__amd"))),
                      key=lambda r: r["name"])

    assert kernels(roc) == kernels(kineto) and len(kernels(roc)) >= 8
    assert roc["classification"] == kineto["classification"]
    assert roc["launch"] == kineto["launch"]


def test_directory_and_files_are_one_rank_per_process(tmp_path):
    synth = planted_gpu_trace("amd")
    kernel = write_rocprof_csv(synth, tmp_path / "host", prefix="111_")
    write_rocprof_csv(synth, tmp_path / "host", prefix="222_")
    files = sorted((tmp_path / "host").glob("111_*_trace.csv"))
    assert len(files) == 4 and group_paths(files) == [kernel]
    res = _run("analyze", *files, "--json", "-")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["ranks"]) == 1
    res = _run("analyze", tmp_path / "host", "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["ranks"]) == 2 and doc["ranks"][0]["steps"] == doc["ranks"][1]["steps"]


def test_multirank_matching(tmp_path):
    """Planted skew and a late rank read the same from rocprofv3 CSVs as from the JSON traces."""
    ranks = planted_ranks([0.0, 0.0], late_rank=1, late_us=100.0, same_host=True, vendor="amd")
    docs = []
    for form in ("json", "roc"):
        paths = [t.write(tmp_path / f"r{i}.json") if form == "json" else
                 write_rocprof_csv(t, tmp_path / "roc", prefix=f"{i}_") for i, t in enumerate(ranks)]
        res = _run("analyze", *paths, "--json", "-")
        assert res.exit_code == 0, res.output
        docs.append(json.loads(res.stdout))
    kineto, roc = docs
    assert [r["steps"] for r in roc["ranks"]] == [r["steps"] for r in kineto["ranks"]]
    a, b = kineto["multirank"], roc["multirank"]
    assert b["wait_ns"] == a["wait_ns"] and b["wait_total_ns"] == {"0": 500_000, "1": 0}
    assert b["steps"] == a["steps"] and b["last_arrivals"] == a["last_arrivals"] == {"0": 0, "1": 5}
    # a rocprofv3 CSV names no host: the clocks are aligned on collective ends, here to a zero offset
    assert b["clock_offset_ns"] == {"0": 0, "1": 0}


def test_diff_takes_rocprof(tmp_path):
    a = write_rocprof_csv(planted_gpu_trace("amd"), tmp_path / "a")
    b = write_rocprof_csv(planted_gpu_trace("amd"), tmp_path / "b")
    res = _run("diff", a, b, "--json", "-")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"]


def test_kind_is_read_from_content(tmp_path):
    kernel = write_rocprof_csv(planted_gpu_trace("amd"), tmp_path)
    assert [sniff(tmp_path / f"4242_{k}.csv") for k in ("kernel_trace", "memory_copy_trace", "hip_api_trace",
                                                       "marker_api_trace")] == \
        ["kernel_trace", "memory_copy_trace", "hip_api_trace", "marker_api_trace"]
    assert sniff(tmp_path / "4242_agent_info.csv") is None
    renamed = kernel.rename(tmp_path / "dispatches.txt")
    trace = load_trace(renamed)  # alone: no siblings by name, still read as a kernel trace
    assert trace.meta["source"] == "rocprofv3" and len(trace.runtime) == 0 and len(trace.device) > 0


@pytest.mark.parametrize(("kind", "drop"), [("kernel_trace", "Kernel_Name"), ("kernel_trace", "End_Timestamp"),
                                            ("memory_copy_trace", "Direction"), ("hip_api_trace", "Correlation_Id")])
def test_unknown_schema_is_refused(tmp_path, kind, drop):
    header = tuple(c for c in ROCPROF_HEADERS[kind] if c != drop)
    path = write_rocprof_csv(planted_gpu_trace("amd"), tmp_path, headers={kind: header})
    with pytest.raises(TraceLoadError, match=f"missing column.*{drop}"):
        load_trace(path)
    res = _run("analyze", path)
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and text.startswith("error:") and "Traceback" not in text
    assert f"4242_{kind}.csv" in text and drop in text


def test_api_trace_alone_needs_its_kernel_trace(tmp_path):
    write_rocprof_csv(planted_gpu_trace("amd"), tmp_path)
    (tmp_path / "4242_kernel_trace.csv").unlink()
    res = _run("analyze", tmp_path / "4242_hip_api_trace.csv")
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text and "4242_kernel_trace.csv" in text


def test_bad_values_are_one_line(tmp_path):
    path = write_rocprof_csv(planted_gpu_trace("amd"), tmp_path)
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace(lines[1].split(",")[9], '"soon"', 1)
    path.write_text("\n".join(lines) + "\n")
    res = _run("analyze", path)
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text and "not an integer" in text


def test_short_row_is_counted_not_silent(tmp_path):
    path = write_rocprof_csv(planted_gpu_trace("amd"), tmp_path)
    with open(path, "a") as f:
        f.write('"KERNEL_DISPATCH","Agent 1",1\n')  # a truncated last line
    trace = load_trace(path)
    assert trace.n_malformed == 1 and any("1 malformed" in w for w in trace.warnings)


def test_marks_are_no_ranges(tmp_path):
    t = SynthTrace(vendor="amd")
    t.step(1, 0, 400)
    t.op("a mark", 150, 0, cat="user_annotation")  # end == start: a roctxMark
    t.launch("triton_poi_fused_add_0", 100, 200, launch_ts=10)
    trace = load_trace(write_rocprof_csv(t, tmp_path))
    assert trace.name_of(trace.cpu.name) == ["ProfilerStep#1"]
    assert trace.n_events == 4  # the mark is counted, and read as nothing


def test_rocm_62_kernel_trace_without_stream_id(tmp_path):
    """ROCm 6.2's kernel trace has no Stream_Id (and integer agent ids): the queue stands for the stream."""
    old = ("Kind", "Agent_Id", "Queue_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id", "Kernel_Name", "Correlation_Id",
           "Start_Timestamp", "End_Timestamp", "Private_Segment_Size", "Group_Segment_Size", "Workgroup_Size_X",
           "Workgroup_Size_Y", "Workgroup_Size_Z", "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z")
    synth = planted_gpu_trace("amd")
    a, _ = step_breakdowns(load_trace(synth.write(tmp_path / "p.json")))
    trace = load_trace(write_rocprof_csv(synth, tmp_path / "r", headers={"kernel_trace": old}))
    b, _ = step_breakdowns(trace)
    assert set(trace.device.stream[trace.device.kind == 0].tolist()) == {1}  # every dispatch on queue 1
    assert [s.step for s in b] == [1, 2] and [s.dur_ns for s in b] == [s.dur_ns for s in a]


def test_rocprofv3_json_output_is_refused_with_the_way_out(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"rocprofiler-sdk-tool": [{"metadata": {"pid": 1},
                                                          "buffer_records": {"kernel_dispatch": []}}]}))
    res = _run("analyze", path)
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text
    assert "rocprofv3 --output-format json file, which is not read" in text and "--output-format csv" in text
