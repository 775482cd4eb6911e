"""The typed decoder agrees with the streaming reader: sound files, byte ranges in parallel processes,
cuts that fall inside an event, keys after the events."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wavefront.workbench.trace import decode
from wavefront.workbench.trace.load import _load_streaming, load_trace
from wavefront.workbench.trace.testing import fsdp_ranks, planted_gpu_trace, write_large_trace

pytest.importorskip("msgspec")


def _same(a, b) -> None:
    for table in ("device", "runtime", "cpu"):
        ta, tb = getattr(a, table), getattr(b, table)
        assert set(ta.cols) == set(tb.cols)
        for k in ta.cols:
            if k == "name":
                assert a.name_of(ta.cols[k]) == b.name_of(tb.cols[k]), table
            elif k == "shape":
                assert [None if i < 0 else a.shapes[i] for i in ta.cols[k]] == \
                    [None if i < 0 else b.shapes[i] for i in tb.cols[k]]
            else:
                np.testing.assert_array_equal(ta.cols[k], tb.cols[k], err_msg=f"{table}.{k}")
    assert (a.meta, a.op_comm_args, a.kernel_comm_args) == (b.meta, b.op_comm_args, b.kernel_comm_args)
    assert (a.n_events, a.n_sync_events, a.n_malformed) == (b.n_events, b.n_sync_events, b.n_malformed)


def _fast(path, **kw):
    trace = decode.load_fast(path, **kw)
    assert trace is not None, "the typed decoder gave the file to the streaming reader"
    return trace


@pytest.mark.parametrize("name", ["cpu_train_h64.json.gz", "gloo_rank0.json.gz"])
def test_real_traces(data_dir, name):
    _same(_fast(data_dir / name), _load_streaming(data_dir / name, None, None))


def test_planted_and_collective_args(tmp_path):
    for i, synth in enumerate([planted_gpu_trace("amd"), fsdp_ranks(2).traces[1]]):
        p = synth.write(tmp_path / f"t{i}.json", indent=2)
        fast = _fast(p)
        _same(fast, _load_streaming(p, None, None))
    assert fast.op_comm_args and all(a["Process Group Name"] == "0" for a in fast.op_comm_args.values())


def test_ranges_in_parallel_processes(tmp_path, monkeypatch):
    p = tmp_path / "big.json"
    write_large_trace(p, 400_000, seed=3)
    serial = _fast(p)
    monkeypatch.setattr(decode, "RANGE_BYTES", 20_000)  # many ranges per worker, cuts everywhere
    monkeypatch.setattr(decode, "PARALLEL_MIN_BYTES", 0)
    _same(_fast(p, workers=3), serial)
    _same(serial, _load_streaming(p, None, None))


def test_cut_inside_an_event_and_keys_after_events(tmp_path, monkeypatch):
    """An argument holding objects ("}, {" inside an event) and a list of objects after traceEvents: a
    cut there never decodes, so the result is the same as the streaming reader's."""
    synth = planted_gpu_trace()
    synth.events[3]["args"]["Input Strides"] = [{"a": 1}, {"b": "}, {"}]
    doc = json.loads(synth.text())
    doc = {"traceEvents": doc.pop("traceEvents"), **doc, "extra": [{"x": 1}, {"y": 2}]}
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(doc, indent=1))
    monkeypatch.setattr(decode, "RANGE_BYTES", 300)
    got = load_trace(p)
    _same(got, _load_streaming(p, None, None))
    assert got.meta["extra"] == [{"x": 1}, {"y": 2}] and len(got.device) == 12


def test_damaged_files_go_to_the_streaming_reader(tmp_path):
    text = planted_gpu_trace().text()
    (tmp_path / "cut.json").write_text(text[: text.index('"Memset (Device)"')])
    assert decode.load_fast(tmp_path / "cut.json") is None
    t = load_trace(tmp_path / "cut.json")
    assert not t.complete and 0 < len(t.device) < 12


def test_float_times_are_exact_or_refused():
    """A time decoded as a float is kept only when it provably equals the exact nanosecond of its text
    (decode._ns_of_floats); Kineto's usual times (three decimals, below 2**40 us) always are, and Unix-epoch
    clocks never pass (they go to the raw-text reader)."""
    import random

    import msgspec

    from wavefront.workbench.trace.clock import us_text_to_ns

    rng = random.Random(7)
    floats = msgspec.json.Decoder(list[float])
    texts = []
    for _ in range(4000):
        whole = rng.choice([0, rng.randrange(10**3), rng.randrange(10**9), rng.randrange(2**40), 1_760_000_000_000_000])
        decimals = rng.choice([0, 1, 3, 3, 3, 4, 6])
        text = f"{'-' if rng.random() < 0.1 else ''}{whole}" + (f".{rng.randrange(10**decimals):0{decimals}d}"
                                                              if decimals else "")
        texts.append(text)
    kept = 0
    for text in texts:
        try:
            got = decode._ns_of_floats(floats.decode(f"[{text}]"))
        except decode._Inexact:
            assert abs(float(text)) >= 2**39 or len(text.split(".")[-1]) > 3 and "." in text
            continue
        kept += 1
        assert int(got[0]) == us_text_to_ns(text), text
    assert kept > 2000
    three = [t for t in texts if abs(float(t)) < 2**39 and ("." not in t or len(t.split(".")[1]) <= 3)]
    decode._ns_of_floats(floats.decode("[" + ",".join(three) + "]"))  # never refused


def test_unusual_fields_fall_back_a_level(tmp_path):
    """An unknown category, a string stream id or a quoted time make a range fail the faster decoders; it
    is decoded again by the next one and the columns are the streaming reader's."""
    synth = planted_gpu_trace()
    synth.events[0]["cat"] = "some_new_category"
    kernel = next(e for e in synth.events if e.get("cat") == "kernel")
    kernel["args"]["stream"] = "stream 7"
    runtime = next(e for e in synth.events if e.get("cat") == "cuda_runtime")
    runtime["ts"] = f'{runtime["ts"]}'
    p = synth.write(tmp_path / "odd.json", indent=1)
    _same(_fast(p), _load_streaming(p, None, None))


def test_flow_before_a_kernel_without_correlation(tmp_path, monkeypatch):
    """ac2g flows are kept only once a device event lacks its correlation id; when such an event's flow
    was in an earlier range (not kept), the file is read again keeping every flow: the link is made."""
    synth = planted_gpu_trace()
    kernel = next(e for e in synth.events if e.get("cat") == "kernel")
    corr = kernel["args"].pop("correlation")
    flow = next(e for e in synth.events if e.get("ph") == "f" and e.get("id") == corr)
    synth.events.remove(flow)
    synth.events.insert(0, flow)
    p = synth.write(tmp_path / "early_flow.json", indent=1)
    monkeypatch.setattr(decode, "RANGE_BYTES", 400)  # the flow and the kernel in different ranges
    monkeypatch.setattr(decode, "_HEAD_BYTES", 1200)
    reads = []
    monkeypatch.setattr(decode, "_read_serial", lambda *a, _read=decode._read_serial: reads.append(a) or _read(*a))
    fast = _fast(p)
    assert [a[-1] for a in reads] == [False, True]  # read again, keeping the flows
    _same(fast, _load_streaming(p, None, None))
    assert corr in fast.device.correlation.tolist() and fast.meta["n_flow_links"] > 1
