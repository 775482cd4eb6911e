"""The `trace analyze` document end to end at a Unix-epoch clock: every time it reports carries exact integer
nanoseconds (checked against integer arithmetic done here, independently of the analysis), the float
microsecond fields are the nearest floats, the annotated copy writes exact times; negative durations are
said, never silently zero; --hta-compatible on jax.profiler traces is a note, not a traceback."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.trace.testing import SynthTrace, fsdp_ranks, planted_gpu_trace

BASE = "1733390000123456.789"  # a Unix-epoch clock in us, with a sub-microsecond fraction
OFFSETS_NS = [0, 2_500_123, -1_300_777, 40_000_001]  # each rank's clock minus true time
CATS = ("compute", "comm_overlapped", "comm_exposed", "memory", "idle_host_bound", "idle_other")


def _run(*args):
    return CliRunner().invoke(build_app(), ["trace", *map(str, args)])


def _ns(value: Decimal) -> int:
    exact = value * 1000
    assert exact == exact.to_integral_value()  # the builder writes whole nanoseconds
    return int(exact)


def _reference(trace: SynthTrace) -> dict[int, dict[str, int]]:
    """Each step's window and breakdown by the definitions in breakdown.py, in plain Python integers, from the
    builder's own decimal times (nothing of the analysis is used)."""
    events = trace.events
    steps = sorted((int(e["name"].split("#")[1]), _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in events
                   if e.get("name", "").startswith("ProfilerStep#"))
    launch_end = {e["args"]["correlation"]: _ns(e["ts"]) + _ns(e["dur"]) for e in events
                  if e.get("cat") == "cuda_runtime" and "correlation" in e["args"]}
    kernels = [(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["name"].startswith("nccl"),
                launch_end[e["args"]["correlation"]]) for e in events if e.get("cat") == "kernel"]
    lo = min([k[0] for k in kernels] + [s[1] for s in steps])
    hi = max([k[1] for k in kernels] + [s[2] for s in steps])
    busy: list[list[int]] = []
    for a, b, _, _ in sorted(kernels):
        if busy and a <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], b)
        else:
            busy.append([a, b])
    edges = [lo] + [x for iv in busy for x in iv] + [hi]
    host_gaps = []
    for g0, g1 in zip(edges[0::2], edges[1::2], strict=True):
        starting = [k[3] for k in kernels if k[0] == g1]
        if g1 > g0 and starting and min(starting) > g0:
            host_gaps.append((g0, g1))
    out = {}
    for n, s, e in steps:
        points = sorted({s, e, *(x for k in kernels for x in k[:2] if s < x < e)})
        pieces = dict.fromkeys(CATS, 0)
        for a, b in zip(points, points[1:], strict=False):
            c = any(k[0] <= a < k[1] and not k[2] for k in kernels)
            x = any(k[0] <= a < k[1] and k[2] for k in kernels)
            if c or x:
                pieces["compute" if not x else "comm_overlapped" if c else "comm_exposed"] += b - a
            else:
                host = any(g0 <= a < g1 for g0, g1 in host_gaps)
                pieces["idle_host_bound" if host else "idle_other"] += b - a
        out[n] = {"start": s, "dur": e - s, **pieces}
    return out


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    planted = fsdp_ranks(4, base_us=BASE, clock_offsets_ns=OFFSETS_NS)
    d = tmp_path_factory.mktemp("fsdp")
    paths = [t.write(d / f"rank{r}.json") for r, t in enumerate(planted.traces)]
    res = _run("analyze", *paths, "--hta-compatible", "--json", d / "doc.json")
    assert res.exit_code == 0, res.output
    return planted, paths, json.loads((d / "doc.json").read_text())


def test_steps_exact_in_integer_ns_at_epoch_clock(fsdp):
    planted, _, doc = fsdp
    assert doc["schema"] == "wavefront.trace.analyze/2"
    base_ns = _ns(Decimal(BASE))
    for r, (rank, trace) in enumerate(zip(doc["ranks"], planted.traces, strict=True)):
        expected = _reference(trace)
        assert [s["step"] for s in rank["steps"]] == sorted(expected)
        for s in rank["steps"]:
            want = expected[s["step"]]
            assert s["start_ns"] == want["start"] == base_ns + OFFSETS_NS[r] + 20_000_000 * s["step"]
            assert {k: s[f"{k}_ns"] for k in want} == want, (r, s["step"])
            assert s["idle_ns"] == want["idle_host_bound"] + want["idle_other"]
            # the float fields are the nearest floats of the exact values (within 125 ns at this clock)
            for k in ("start", "dur", *CATS):
                assert s[f"{k}_us"] == s[f"{k}_ns"] / 1000
        assert rank["totals"]["step_ns"] == sum(w["dur"] for w in expected.values())
        assert rank["totals"]["idle_other_ns"] == sum(w["idle_other"] for w in expected.values())
    # both idle kinds occur, and some host-bound gap is split by a step boundary (where float windows erred)
    steps = [s for rank in doc["ranks"] for s in rank["steps"]]
    assert any(s["idle_host_bound_ns"] and s["idle_other_ns"] for s in steps)


def test_multirank_and_tables_carry_exact_ns(fsdp):
    planted, _, doc = fsdp
    mr = doc["multirank"]
    assert mr["clock_offset_ns"] == {str(r): -OFFSETS_NS[r] for r in range(4)}
    assert mr["alignment_residual_ns"] == 0
    assert mr["wait_ns"] == {str(r): {str(k): v for k, v in w.items()} for r, w in planted.wait_ns.items()}
    assert mr["wait_total_ns"] == {str(r): sum(w.values()) for r, w in planted.wait_ns.items()}
    for s in mr["steps"]:
        assert s["dur_ns_by_rank"] == dict.fromkeys(map(str, range(4)), 18_000_000) and s["skew_ns"] == 0
    rank = doc["ranks"][0]
    gemm = next(k for k in rank["kernels"]["kernels"] if "gemm" in k["name"])
    assert gemm["count"] == 12 and gemm["total_ns"] == 12 * 600_000 and gemm["max_ns"] == 600_000
    assert gemm["median_ns"] == 600_000 and gemm["total_us"] == 7200.0
    launch = rank["launch"]
    assert launch["delay_ns"]["n"] == launch["delay_us"]["n"] > 0
    assert launch["delay_ns"]["max"] == launch["delay_us"]["max"] * 1000
    assert all(p["launch_cpu_ns"] == 4 * 5_000 + 8 * 5_000 for p in launch["per_step"])  # 12 launches of 5 us
    hta = rank["hta_equivalent"]
    assert {k: hta[f"{k}_ns"] for k in ("kernel_time", "idle_time")} == \
        {k: hta[f"{k}_us"] * 1000 for k in ("kernel_time", "idle_time")}
    assert hta["kernel_time_ns"] % 1000 == 0  # HTA's whole-microsecond rounding


def test_annotated_copy_writes_exact_times(fsdp, tmp_path):
    planted, paths, _ = fsdp
    out = tmp_path / "r1.annotated.json.gz"
    res = _run("analyze", paths[1], "--annotate", out)
    assert res.exit_code == 0, res.output
    with gzip.open(out, "rt") as f:
        text = f.read()
    expected = _reference(planted.traces[1])
    found = re.findall(r'"tid": "steps", "ts": ([0-9.]+), "dur": ([0-9.]+)', text)
    assert found == [(f"{w['start'] // 1000}.{w['start'] % 1000:03d}", f"{w['dur'] // 1000}.{w['dur'] % 1000:03d}")
                     for _, w in sorted(expected.items())]
    json.loads(text)  # still a valid document


def _negative_trace(tmp_path):
    t = planted_gpu_trace()
    step2 = next(e for e in t.events if e.get("name") == "ProfilerStep#2")
    step2["dur"] = Decimal("-1000")
    return t.write(tmp_path / "neg.json")


def test_negative_durations_are_said_not_zeroed(tmp_path):
    path = _negative_trace(tmp_path)
    res = _run("analyze", path, "--json", tmp_path / "doc.json")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "doc.json").read_text())
    (warning,) = [w for w in doc["ranks"][0]["warnings"] if "negative duration" in w]
    assert "neg.json" in warning and "'ProfilerStep#2'" in warning and "dur -1000.000 us" in warning
    assert "negative duration" in " ".join(res.stdout.split())  # and on the terminal
    steps = doc["ranks"][0]["steps"]
    assert [s["step"] for s in steps] == [1] and all(s["dur_ns"] > 0 for s in steps)


def test_only_negative_durations_is_one_line_exit_2(tmp_path):
    t = SynthTrace()
    t.step(1, 0, -5)
    t.op("aten::mm", 1, -2)
    res = _run("analyze", t.write(tmp_path / "allneg.json"))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "allneg.json" in lines[0] and "negative duration" in lines[0], res.stderr


def test_hta_compatible_on_jax_traces_is_a_note(data_dir):
    res = _run("analyze", data_dir / "jax_cpu", "--hta-compatible", "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    for rank in doc["ranks"]:
        assert rank["hta_equivalent"] is None
        assert any("HTA-equivalent figures not computed" in n and "launch" in n for n in rank["notes"])
    table = _run("analyze", data_dir / "jax_cpu", "--hta-compatible")
    assert table.exit_code == 0 and "Traceback" not in table.output
    assert "host=None" not in table.output and "trace  host.trace.json.gz  device=none" in table.output
