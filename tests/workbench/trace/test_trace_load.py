"""The streaming loader: formats, chunk boundaries, damaged files."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from wavefront.workbench.trace import load as load_mod
from wavefront.workbench.trace.load import TraceLoadError, load_trace
from wavefront.workbench.trace.model import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET
from wavefront.workbench.trace.testing import SynthTrace, planted_gpu_trace


def _same_tables(a, b) -> None:
    for table in ("device", "runtime", "cpu"):
        ta, tb = getattr(a, table), getattr(b, table)
        assert set(ta.cols) == set(tb.cols)
        for k in ta.cols:
            np.testing.assert_array_equal(ta.cols[k], tb.cols[k], err_msg=f"{table}.{k}")
    assert [a.names[i] for i in a.device.name] == [b.names[i] for i in b.device.name]


def test_planted_counts_and_kinds(tmp_path):
    t = load_trace(planted_gpu_trace().write(tmp_path / "p.json"))
    assert t.complete and t.warnings == []
    assert len(t.device) == 12 and len(t.runtime) == 11 and t.n_sync_events == 1
    kinds = np.bincount(t.device.kind, minlength=3)
    assert kinds[KIND_KERNEL] == 10 and kinds[KIND_MEMCPY] == 1 and kinds[KIND_MEMSET] == 1
    assert t.device_name == "NVIDIA H100 80GB HBM3"
    # microseconds with three decimals become exact integer nanoseconds
    assert t.device.ts_ns.dtype == np.int64 and int(t.device.ts_ns.min()) == 1_000_100_000


def test_plain_gzip_indent_and_tiny_chunks_agree(tmp_path, monkeypatch):
    synth = planted_gpu_trace("amd")
    plain = load_trace(synth.write(tmp_path / "a.json"))
    gz = load_trace(synth.write(tmp_path / "a.json.gz"))
    indented = load_trace(synth.write(tmp_path / "b.json", indent=2))
    monkeypatch.setattr(load_mod, "CHUNK_BYTES", 7)  # every value straddles a chunk boundary
    tiny = load_trace(tmp_path / "b.json")
    for other in (gz, indented, tiny):
        _same_tables(plain, other)
    assert tiny.complete


def test_array_form_and_keys_after_events(tmp_path):
    synth = planted_gpu_trace()
    doc = synth.to_dict()
    (tmp_path / "arr.json").write_text(json.dumps(doc["traceEvents"]))
    arr = load_trace(tmp_path / "arr.json")
    assert len(arr.device) == 12 and arr.device_name is None
    late = {"traceEvents": doc["traceEvents"], **{k: v for k, v in doc.items() if k != "traceEvents"}}
    (tmp_path / "late.json").write_text(json.dumps(late))
    t = load_trace(tmp_path / "late.json")
    assert t.device_name == "NVIDIA H100 80GB HBM3" and len(t.device) == 12


def test_truncated_file_keeps_events_before_the_cut(tmp_path):
    text = json.dumps(planted_gpu_trace().to_dict(), indent=1)
    cut = text.index('"Memset (Device)"')
    (tmp_path / "cut.json").write_text(text[:cut])
    t = load_trace(tmp_path / "cut.json")
    assert not t.complete
    assert any("truncated" in w for w in t.warnings)
    assert 0 < len(t.device) < 12  # everything before the cut, nothing after
    with gzip.open(tmp_path / "cut.json.gz", "wt") as f:
        f.write(text)
    raw = (tmp_path / "cut.json.gz").read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(raw[: len(raw) * 2 // 3])
    tg = load_trace(tmp_path / "cut.json.gz")
    assert not tg.complete and any("gzip" in w or "truncated" in w for w in tg.warnings)


def test_corrupt_middle_and_malformed_event(tmp_path):
    text = json.dumps(planted_gpu_trace().to_dict())
    i = text.index('"cat": "gpu_memset"')
    (tmp_path / "bad.json").write_text(text[:i] + "@@@" + text[i:])
    t = load_trace(tmp_path / "bad.json")
    assert not t.complete and any("corrupt JSON" in w for w in t.warnings)
    synth = planted_gpu_trace()
    synth.events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1, "args": {}})
    t2 = load_trace(synth.write(tmp_path / "malformed.json"))
    assert t2.complete and len(t2.device) == 12
    assert any("1 malformed event" in w for w in t2.warnings)


@pytest.mark.parametrize("content", ["", "hello", "[1, 2", '{"schemaVersion": 1}'])
def test_unusable_files_raise_clearly(tmp_path, content):
    p = tmp_path / "x.json"
    p.write_text(content)
    with pytest.raises(TraceLoadError, match="x.json"):
        load_trace(p)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="not found"):
        load_trace("/nonexistent/trace.json")


def test_flow_links_give_missing_correlation(tmp_path):
    synth = SynthTrace()
    synth.step(1, 0, 100)
    op = synth.op("aten::mul", 0, 5)
    corr = synth.launch("k", 20, 10, launch_ts=1, op=op)
    for e in synth.events:
        if e.get("cat") == "kernel":
            del e["args"]["correlation"]
    t = load_trace(synth.write(tmp_path / "f.json"))
    assert t.device.correlation.tolist() == [corr]


def test_legacy_category_names(tmp_path):
    synth = SynthTrace()
    synth.launch("k", 20, 10, launch_ts=1)
    synth.launch("Memcpy DtoH", 40, 10, launch_ts=2, cat="gpu_memcpy")
    for e in synth.events:
        e["cat"] = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "cuda_runtime": "Runtime"}.get(e["cat"], e["cat"])
    t = load_trace(synth.write(tmp_path / "legacy.json"))
    assert t.device.kind.tolist() == [KIND_KERNEL, KIND_MEMCPY] and len(t.runtime) == 2
