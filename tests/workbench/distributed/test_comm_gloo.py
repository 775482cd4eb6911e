"""`wavefront comm` on CPU gloo: 2 ranks under torchrun, 4 ranks started with --nproc, every result
checked; a collective the backend lacks is reported, not faked; bad invocations fail in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from typer.testing import CliRunner

from wavefront.workbench.distributed import comm as bench
from wavefront.workbench.planner import make_cluster
from wavefront.workbench.planner.comm_model import COLLECTIVES, bus_factor, load_calibration

SRC = str(Path(__file__).resolve().parents[3] / "src")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _run(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_sizes_are_powers_of_two():
    assert bench.sizes_pow2(8, 64) == [8, 16, 32, 64]
    assert bench.sizes_pow2(5, 40) == [8, 16, 32]
    with pytest.raises(ValueError):
        bench.sizes_pow2(64, 8)


def test_comm_two_ranks_under_torchrun(tmp_path):
    # --standalone: a free rendezvous port, so parallel test workers never collide on 29500.
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                "wavefront", "comm",
                "--min-bytes", "64", "--max-bytes", "4096", "--warmup", "1", "--iters", "2", "--repeats", "2",
                "--calibration", "cal.json", "--json", "comm.json"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "comm.json").read_text())
    assert doc["schema"] == "wavefront.comm/1"
    assert doc["runtime"]["world_size"] == 2 and doc["runtime"]["backend"] == "gloo"
    assert doc["failures"] == [] and doc["unsupported"] == {}
    results = doc["results"]
    assert {r["collective"] for r in results} == set(COLLECTIVES)
    expected = {("all_gather", "in-place"), ("all_gather", "out-of-place"), ("reduce_scatter", "in-place")}
    assert {(r["collective"], r["mode"]) for r in results} >= expected
    sizes = {r["size_bytes"] for r in results}
    assert sizes == {64, 128, 256, 512, 1024, 2048, 4096}
    for r in results:
        assert r["correct"]
        assert r["time_us"] > 0 and r["time_us_min"] <= r["time_us"]
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["collective"], 2))
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
    # one alpha-beta fit per collective, stored where the planner reads it
    cal = load_calibration(tmp_path / "cal.json")
    assert cal.domain == "intra" and cal.world_size == 2 and "CPU gloo" in cal.note
    assert {f.collective for f in cal.fits} == set(COLLECTIVES)
    cluster = make_cluster("8xh100", calibrations=(cal,))
    link = cluster.link("all_reduce", 2, 1)
    fit = cal.fit_for("all_reduce", 2)
    assert link.source.startswith("calibrated") and link.busbw_gbps == fit.busbw_gbps


@pytest.mark.slow  # 24 s; test_comm_two_ranks_under_torchrun keeps the launcher path in the default suite
def test_comm_four_ranks_group_sizes(tmp_path):
    out = _run([sys.executable, "-m", "wavefront", "comm", "--nproc", "4", "--op", "all_reduce", "--op", "all_gather",
                "--op", "reduce_scatter", "--op", "all_to_all", "--mode", "out-of-place", "--min-bytes", "256",
                "--max-bytes", "512", "--warmup", "0", "--iters", "1", "--repeats", "1", "--calibration", "",
                "--json", "comm.json"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads((tmp_path / "comm.json").read_text())
    assert doc["runtime"]["world_size"] == 4 and doc["config"]["group_sizes"] == [2, 4]
    assert doc["calibration"] is None and not (tmp_path / "comm-calibration.json").exists()
    seen = {(r["collective"], r["group_size"]) for r in doc["results"]}
    assert seen == {(c, g) for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") for g in (2, 4)}
    assert all(r["correct"] for r in doc["results"])
    # all_reduce has no out-of-place form in torch.distributed: it ran in place rather than being skipped
    assert {r["mode"] for r in doc["results"] if r["collective"] == "all_reduce"} == {"in-place"}
    assert {(f["collective"], f["group_size"]) for f in doc["fits"]} == seen
    for r in doc["results"]:
        if r["collective"] in ("all_gather", "reduce_scatter", "all_to_all"):
            # nccl-tests S is the full array: divisible by the group, each rank holds S / n
            assert r["size_bytes"] % (4 * r["group_size"]) == 0


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_unsupported_dtype_is_reported_not_faked(world_of_one):
    report = bench.run_benchmark(["all_reduce", "all_gather"], [64, 128], group_sizes=[1], dtype="fp8", iters=1,
                                 repeats=1)
    assert report.results == []
    assert set(report.unsupported) == {"all_reduce", "all_gather"}
    assert all(msg.startswith("gloo with fp8") for msg in report.unsupported.values())


def test_single_rank_cases_are_checked(world_of_one):
    report = bench.run_benchmark(["all_reduce", "reduce_scatter", "all_to_all", "broadcast"], [64, 256],
                                 group_sizes=[1], iters=1, repeats=1)
    assert report.failures == [] and report.unsupported == {}
    assert len(report.results) == 2 * (1 + 2 + 1 + 1)
    for r in report.results:
        assert r.correct
        # one rank moves no bytes (factor 0), except broadcast whose factor is 1 at any n
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * (1.0 if r.collective == "broadcast" else 0.0))
    assert report.fits == []


def test_comm_outside_a_launcher_is_one_clear_line(monkeypatch):
    from wavefront.cli import build_app

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    result = CliRunner().invoke(build_app(), ["comm"])
    assert result.exit_code == 2
    assert "run under torchrun" in result.output and "Traceback" not in result.output
    bad = CliRunner().invoke(build_app(), ["comm", "--op", "allreduce", "--nproc", "2"])
    text = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "'allreduce' is not one of" in text and "Traceback" not in text


@pytest.mark.parametrize(("args", "message"), [
    (["--op", "all_reduce", "--group-size", "3", "--nproc", "2"], "--group-size 3 does not divide the world size 2"),
    (["--min-bytes", "64", "--max-bytes", "8", "--nproc", "2"], "need 1 <= --min-bytes <= --max-bytes, got 64, 8"),
])
def test_comm_bad_input_exits_2_with_one_error(monkeypatch, args, message):
    from wavefront.cli import build_app

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    r = CliRunner().invoke(build_app(), ["comm", *args])
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error:") and message in text and "Traceback" not in r.output
