"""Nsight Systems SQLite exports through the same exact breakdown as torch.profiler traces."""

from __future__ import annotations

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.trace import load_trace
from wavefront.workbench.trace.breakdown import step_breakdowns
from wavefront.workbench.trace.classify import COMM, REASONS, classify_device
from wavefront.workbench.trace.load import TraceLoadError
from wavefront.workbench.trace.testing import (
    NSYS_TABLES,
    SynthTrace,
    planted_gpu_trace,
    write_nsys_sqlite,
)

runner = CliRunner()


def _run(*args):
    return runner.invoke(build_app(), ["trace", *map(str, args)])


def test_cli_json_matches_kineto(tmp_path):
    synth = planted_gpu_trace("nvidia")
    docs = []
    for path in (synth.write(tmp_path / "p.json"), write_nsys_sqlite(synth, tmp_path / "p.sqlite")):
        res = _run("analyze", path, "--json", "-")
        assert res.exit_code == 0, res.output
        docs.append(json.loads(res.stdout)["ranks"][0])
    kineto, nsys = docs
    assert nsys["steps"] == kineto["steps"]
    # the kernel table, launch statistics, classification, families and collectives too; what differs is
    # what an export does not carry (host name, GPU-side sync records, input shapes for the roofline)
    def by_name(rows: list[dict]) -> list[dict]:  # rows of equal time may come in another order
        return sorted(rows, key=lambda r: r["name"])

    assert by_name(nsys["kernels"]["kernels"]) == by_name(kineto["kernels"]["kernels"])
    assert (kineto["source"], nsys["source"]) == ("json", "nsys")
    same = set(kineto) - {"path", "host", "n_events", "notes", "kernels", "source"}
    assert {"launch", "classification", "steps"} <= same
    assert {k: nsys[k] for k in same} == {k: kineto[k] for k in same}


def test_kind_is_read_from_content(tmp_path):
    synth = planted_gpu_trace("nvidia")
    disguised = write_nsys_sqlite(synth, tmp_path / "looks like #1?.json")
    assert load_trace(disguised).meta["source"] == "nsys"
    json_named_sqlite = synth.write(tmp_path / "trace.sqlite", gz=False)
    assert "source" not in load_trace(json_named_sqlite).meta


@pytest.mark.parametrize(("tables", "missing"), [
    ({"foo": "a INTEGER"}, "table CUPTI_ACTIVITY_KIND_KERNEL"),
    ({**NSYS_TABLES, "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER, end INTEGER, deviceId INTEGER, "
      "streamId INTEGER, demangledName INTEGER"}, "CUPTI_ACTIVITY_KIND_KERNEL.correlationId"),
    ({**NSYS_TABLES, "NVTX_EVENTS": "start INTEGER, end INTEGER, eventType INTEGER, globalTid INTEGER"},
     "NVTX_EVENTS.text or .textId"),
])
def test_unknown_schema_is_refused(tmp_path, tables, missing):
    path = write_nsys_sqlite(planted_gpu_trace(), tmp_path / "foreign.sqlite", tables=tables)
    with pytest.raises(TraceLoadError, match="not an Nsight Systems SQLite export"):
        load_trace(path)
    res = _run("analyze", path)
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and text.startswith("error:") and "Traceback" not in text
    assert str(path.name) in text and missing in text


def test_truncated_sqlite_is_one_line(tmp_path):
    path = write_nsys_sqlite(planted_gpu_trace(), tmp_path / "p.sqlite")
    path.write_bytes(path.read_bytes()[:200])
    res = _run("analyze", path)
    assert res.exit_code == 2 and "Traceback" not in res.output and "p.sqlite" in " ".join(res.output.split())


def test_runtime_names_lose_the_nsys_version_suffix(tmp_path):
    trace = load_trace(write_nsys_sqlite(planted_gpu_trace(), tmp_path / "p.sqlite"))
    assert "cudaLaunchKernel" in set(trace.name_of(trace.runtime.name))
    with sqlite3.connect(tmp_path / "p.sqlite") as db:
        assert db.execute("SELECT count(*) FROM StringIds WHERE value = 'cudaLaunchKernel_v7000'").fetchone() == (1,)


def test_nvtx_text_ids_and_marks(tmp_path):
    """Range names through StringIds (textId), start/end ranges (60) as steps; marks (34) are no range."""
    path = write_nsys_sqlite(planted_gpu_trace(), tmp_path / "p.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO StringIds VALUES (9001, 'ProfilerStep#1'), (9002, 'ProfilerStep#2')")
        db.execute("UPDATE NVTX_EVENTS SET textId = 9000 + CAST(substr(text, 14) AS INTEGER), text = NULL, "
                   "eventType = 60 WHERE text LIKE 'ProfilerStep#%'")
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) "
                   "VALUES (1000000500000, NULL, 34, 'ProfilerStep#9', 1)")
        assert db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text IS NULL AND eventType = 60").fetchone() == (2,)
    db.close()
    kineto, _ = step_breakdowns(load_trace(planted_gpu_trace().write(tmp_path / "p.json")))
    nsys, _ = step_breakdowns(load_trace(path))
    assert [s.step for s in nsys] == [1, 2] and nsys == kineto


def test_device_name_and_diff(tmp_path):
    """The GPU named in TARGET_INFO_GPU picks the roofline row; `trace diff` takes exports like JSON traces."""
    a = write_nsys_sqlite(planted_gpu_trace(), tmp_path / "a.sqlite")
    assert load_trace(a).device_name == "NVIDIA H100 80GB HBM3"
    res = _run("analyze", a, "--json", "-")
    assert res.exit_code == 0 and json.loads(res.stdout)["ranks"][0]["kernels"]["gpu"] is not None
    diff = _run("diff", a, write_nsys_sqlite(planted_gpu_trace(), tmp_path / "b.sqlite"), "--json", "-")
    assert diff.exit_code == 0, diff.output
    assert json.loads(diff.stdout)["rows"]


def test_null_time_is_refused(tmp_path):
    loose = "start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER, correlationId INTEGER, shortName INTEGER"
    path = write_nsys_sqlite(planted_gpu_trace(), tmp_path / "null.sqlite",
                             tables={**NSYS_TABLES, "CUPTI_ACTIVITY_KIND_KERNEL": loose})
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO StringIds VALUES (1, 'k')")
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (NULL, 5, 0, 7, 1, 1)")
    db.close()
    with pytest.raises(TraceLoadError, match="null.sqlite: not a readable Nsight Systems SQLite export"):
        load_trace(path)


def test_directory_of_exports_is_one_rank_per_file(tmp_path):
    for rank in range(2):
        write_nsys_sqlite(planted_gpu_trace(), tmp_path / f"rank{rank}.sqlite")
    res = _run("analyze", tmp_path, "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["ranks"]) == 2 and doc["ranks"][0]["steps"] == doc["ranks"][1]["steps"]


def test_a_user_range_decides_no_kernel_class(tmp_path):
    """A kernel launched inside a user's NVTX range ("forward", not an operator) keeps the name rule: an
    NCCL kernel there is communication; inside an operator range (aten::mm) the operator decides."""
    t = SynthTrace()
    t.op("forward", 0, 1000, cat="user_annotation")
    t.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 100, 300, launch_ts=10,
             stream=20)
    mm = t.op("aten::mm", 15, 20)
    t.launch("ncclKernel_looks_like_nccl_but_launched_by_mm", 500, 100, launch_ts=20, stream=21, op=mm)
    trace = load_trace(write_nsys_sqlite(t, tmp_path / "ranges.sqlite"))
    classes = classify_device(trace)
    assert classes.cls.tolist() == [COMM, 0]
    assert [REASONS[r] for r in classes.reason.tolist()] == ["name", "launch-op"]


def test_event_types_from_the_exports_enum(tmp_path):
    """An export that names its event types (ENUM_NSYS_EVENT_TYPE) is read by the names, not the codes;
    one whose enum names no NVTX range type is refused."""
    path = write_nsys_sqlite(planted_gpu_trace(), tmp_path / "p.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER PRIMARY KEY, name TEXT, label TEXT)")
        db.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
                       [(34, "NvtxMark", "NVTX Mark"), (59, "NvtxPushPopRange", "NVTX PushPop Range"),
                        (60, "NvtxStartEndRange", "NVTX StartEnd Range"), (75, "NvtxDomainCreate", "")])
    db.close()
    kineto, _ = step_breakdowns(load_trace(planted_gpu_trace().write(tmp_path / "p.json")))
    assert step_breakdowns(load_trace(path))[0] == kineto
    with sqlite3.connect(path) as db:  # a future release that renumbers push/pop ranges: read by name
        db.execute("UPDATE NVTX_EVENTS SET eventType = 159 WHERE eventType = 59")
        db.execute("UPDATE ENUM_NSYS_EVENT_TYPE SET id = 159 WHERE name = 'NvtxPushPopRange'")
    db.close()
    assert step_breakdowns(load_trace(path))[0] == kineto
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM ENUM_NSYS_EVENT_TYPE WHERE name LIKE 'Nvtx%Range'")
    db.close()
    with pytest.raises(TraceLoadError, match="p.sqlite: .*names no NVTX range type"):
        load_trace(path)


def test_nccl_domain_ranges_are_collectives(tmp_path):
    """NCCL's own NVTX ranges (domain "NCCL") make the kernel launched inside them communication, even
    one whose name says nothing; the same range in the default domain is an annotation."""
    t = SynthTrace()
    t.launch("fused_kernel_of_unknown_kind", 100, 300, launch_ts=20, stream=20)
    path = write_nsys_sqlite(t, tmp_path / "nccl.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                   "VALUES (1000000000, NULL, 75, 'NCCL', 0, 3)")
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                   "VALUES (1000010000, 1000030000, 59, 'ncclAllReduce', ?, 3)",
                   ((4242 << 24) | 4242,))
    db.close()
    trace = load_trace(path)
    classes = classify_device(trace)
    assert classes.cls.tolist() == [COMM] and REASONS[classes.reason[0]] == "launch-op"
    assert list(trace.op_comm_args.values()) == [{"Collective name": "ncclAllReduce"}]
    with sqlite3.connect(path) as db:
        db.execute("UPDATE NVTX_EVENTS SET domainId = 0 WHERE eventType = 59")
    db.close()
    classes = classify_device(load_trace(path))
    assert classes.cls.tolist() == [0] and REASONS[classes.reason[0]] == "default"
