"""Overlap metrics, DDP's bucket assignment, the exposed-communication model, and the probe on 2 gloo ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from wavefront.shapes import get_model
from wavefront.workbench.distributed.overlap import (
    FIRST_BUCKET_BYTES,
    ddp_bucket_sweep,
    ddp_buckets,
    ddp_first_bucket_bytes,
    overlap_metrics,
    predict_ddp_exposed,
    probe_overlap,
    proxy_model,
)
from wavefront.workbench.planner.comm_model import AlphaBeta

SRC = str(Path(__file__).resolve().parents[3] / "src")


def test_overlap_metrics():
    # fully hidden: both takes as long as compute
    assert overlap_metrics(10.0, 4.0, 10.0) == (0.0, 1.0)
    # serialised: both = compute + comm
    assert overlap_metrics(10.0, 4.0, 14.0) == (4.0, 0.0)
    exposed, eff = overlap_metrics(10.0, 4.0, 12.0)
    assert exposed == pytest.approx(2.0) and eff == pytest.approx(0.5)


@pytest.mark.parametrize("cap_mb", [0.25, 1, 4, 25])
@pytest.mark.parametrize("first", ["default-cap", "explicit-cap"])
def test_ddp_buckets_match_torch(cap_mb, first):
    params = list(proxy_model(get_model("llama3-8b"), shrink=16, n_layers=2).parameters())
    cap = int(cap_mb * 1024 * 1024)
    first_cap = min(FIRST_BUCKET_BYTES, cap) if first == "default-cap" else ddp_first_bucket_bytes(cap)
    limits = [first_cap, cap] if first_cap < cap else [cap]
    torch_buckets, _ = dist._compute_bucket_assignment_by_size(params[::-1], limits, [False] * len(params))
    expected = [[len(params) - 1 - i for i in b] for b in torch_buckets]
    assert ddp_buckets([p.numel() * p.element_size() for p in params], cap, first_cap) == expected


def test_proxy_keeps_the_preset_proportions():
    dims = get_model("llama3-70b")
    layer = proxy_model(dims, shrink=64, n_layers=1)[0]
    assert layer.wq.weight.shape == (8192 // 64, 8192 // 64)
    assert layer.wk.weight.shape == (1024 // 64, 8192 // 64)  # GQA: 8 KV heads of 128
    assert layer.up.weight.shape == (28672 // 64, 8192 // 64) and layer.gate is not None


def test_predicted_exposure_hand_example():
    # 4 equal 1 MiB gradients over a 4 ms backward; buckets: 1 MiB first, then 2 MiB caps -> [3], [2, 1], [0]
    ab = AlphaBeta("all_reduce", 2, 100.0, 1.0, 2, 8, 1 << 20, 0.0)  # 0.1 ms + bytes / 1 GB/s
    grads = [1 << 20] * 4
    assert ddp_buckets(grads, 2 << 20, FIRST_BUCKET_BYTES) == [[3], [2, 1], [0]]
    t1 = 1e-4 + (1 << 20) / 1e9
    t2 = 1e-4 + (2 << 20) / 1e9
    # ready at 1, 3, 4 ms; bucket 1 ends 1 + t1, bucket 2 starts at max(3 ms, that), bucket 3 after it
    end = max(1e-3, 0.0) + t1
    end = max(3e-3, end) + t2
    end = max(4e-3, end) + t1
    assert predict_ddp_exposed(grads, 4e-3, 2 << 20, ab, FIRST_BUCKET_BYTES) == pytest.approx(end - 4e-3)


def test_smaller_buckets_expose_less_when_bandwidth_bound():
    ab = AlphaBeta("all_reduce", 8, 5.0, 50.0, 2, 8, 1 << 30, 0.0)
    grads = [16 << 20] * 64  # 1 GiB of gradients over a 100 ms backward
    exposed = [predict_ddp_exposed(grads, 0.1, int(cap * 1024 * 1024), ab, int(cap * 1024 * 1024))
               for cap in (1024, 100, 25)]
    assert exposed[0] > exposed[1] > exposed[2] > 0.0
    # one giant bucket exposes the whole reduction: alpha + 1.75 * 1 GiB / 50 GB/s
    assert exposed[0] == pytest.approx(ab.time_s(64 * (16 << 20)), rel=1e-9)


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_probe_and_bucket_sweep_in_process(world_of_one):
    probe = probe_overlap(4096, matmul_n=32, matmul_iters=2, repeats=2)
    assert probe.compute_ms > 0 and probe.comm_ms > 0 and probe.both_ms > 0
    assert probe.exposed_comm_ms >= 0 and 0.0 <= probe.overlap_efficiency <= 1.0
    ab = AlphaBeta("all_reduce", 2, 50.0, 1.0, 2, 8, 1 << 20, 0.0)
    results, info = ddp_bucket_sweep(get_model("llama3-8b"), [0.0625, 1.0], shrink=64, n_layers=2, tokens=8,
                                     steps=2, all_reduce=ab)
    assert info["n_tensors"] == 2 * 9 and info["proxy_grad_bytes"] == 4 * info["proxy_params"]
    assert [r.bucket_cap_mib for r in results] == [0.0625, 1.0]
    assert results[0].n_buckets > results[1].n_buckets
    for r in results:
        assert r.step_ms > 0 and r.no_sync_ms > 0 and r.backward_ms > 0 and r.exposed_ms >= 0
        assert r.predicted_exposed_ms is not None and r.predicted_exposed_ms > 0


@pytest.mark.slow
def test_overlap_verb_two_ranks(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "wavefront", "overlap", "--nproc", "2", "--size-bytes", "65536",
                          "--matmul-n", "64", "--matmul-iters", "4", "--bucket-mib", "0.25", "--bucket-mib", "4",
                          "--shrink", "32", "--layers", "2", "--tokens", "16", "--steps", "3", "--json", "ov.json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "ov.json").read_text())
    assert doc["schema"] == "wavefront.overlap/2" and doc["runtime"]["world_size"] == 2
    (probe,) = doc["probes"]
    assert probe["size_bytes"] == 65536 and probe["exposed_comm_ms"] >= 0.0
    assert 0.0 <= probe["overlap_efficiency"] <= 1.0
    buckets = doc["ddp"]["buckets"]
    assert [b["bucket_cap_mib"] for b in buckets] == [0.25, 4.0]
    assert buckets[0]["n_buckets"] > buckets[1]["n_buckets"] >= 1
    for b in buckets:
        assert b["exposed_ms"] >= 0.0 and b["predicted_exposed_ms"] is not None and b["predicted_exposed_ms"] >= 0.0
        assert b["backward_ms"] > 0.0
    assert doc["all_reduce_fit"]["busbw_gbps"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--bucket-mib", "0", "--nproc", "2"], "--bucket-mib values must be > 0, got [0.0]"),
    (["--model", "llama9-1t", "--nproc", "2"], "--model:"),
])
def test_overlap_bad_input_exits_2_with_one_error(monkeypatch, args, message):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    r = CliRunner().invoke(build_app(), ["overlap", *args])
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error:") and message in text and "Traceback" not in r.output
