"""`wavefront train` end to end on this CPU: 2 gloo ranks under DDP and FSDP2 with --compare, failure
injection, NaN stop, bad configuration, and resume after a kill. Each run is a real torchrun job in a
subprocess (tiny model, seq 8), with a hard timeout so a hang fails the test instead of the suite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SMALL = ["--seq-len", "8", "--global-batch", "4", "--micro-batch", "1", "--steps", "3", "--timeout", "60"]


def _env() -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    src = str(Path(__file__).resolve().parents[3] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _train(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "wavefront", "train", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=timeout)


def _check_kpis(doc: dict, world: int, measured: int = 2) -> None:
    assert doc["schema"] == "wavefront.train/1"
    assert [v["variant"] for v in doc["variants"]] == ["baseline", "wavefront"]
    for v in doc["variants"]:
        s = v["summary"]
        assert v["status"] == "ok" and len(v["steps"]) == 3
        assert s["tokens_per_s"] > 0 and s["tokens_per_s_per_device"] == pytest.approx(s["tokens_per_s"] / world)
        assert 0 < s["mfu"] <= 1 and s["peak"]["source"].startswith("measured")
        assert s["peak_mem_bytes"] > 0
        assert s["comm_s"] >= 0 and s["fwd_s"] > 0 and s["bwd_s"] > 0 and s["opt_s"] > 0
        parts = s["fwd_s"] + s["bwd_s"] + s["comm_s"] + s["opt_s"]
        assert parts == pytest.approx(s["step_s_mean"], rel=1e-6)
        assert s["steps_measured"] == measured, "warm-up and profiled steps are left out of the summary"
    patched = doc["variants"][1]["patch_report"]
    assert patched["counts"]["rms_norm"] == 5
    # The fused loss's KPIs: token accuracy per step (a fraction) and the z-loss term (0: no coefficient set);
    # the unpatched baseline has no fused loss, so none.
    base, ours = doc["variants"]
    assert all(0.0 <= s["token_accuracy"] <= 1.0 and s["z_loss"] == 0.0 for s in ours["steps"])
    assert ours["summary"]["final_token_accuracy"] == ours["steps"][-1]["token_accuracy"]
    assert all(s["token_accuracy"] is None for s in base["steps"]) and base["summary"]["final_token_accuracy"] is None
    cmp = doc["comparison"]
    assert cmp["tokens_per_s_ratio"] > 0 and cmp["max_abs_loss_diff"] < 1e-4


def _stored(db: Path, run_id: str) -> dict:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        query = "SELECT variant, status, tokens_per_s, mfu FROM train_runs WHERE run_id=?"
        rows = con.execute(query, (run_id,)).fetchall()
        n_steps = con.execute("SELECT COUNT(*) FROM train_steps WHERE run_id=?", (run_id,)).fetchone()[0]
    finally:
        con.close()
    return {"runs": rows, "n_steps": n_steps}


def test_ddp_two_ranks_compare(tmp_path):
    r = _train(tmp_path, "--nproc-per-node", "2", "--parallel", "ddp", "--compare", *SMALL, "--json", "out.json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    _check_kpis(doc, world=2)
    assert doc["provenance"]["world_size"] == 2 and doc["provenance"]["parallel"] == "ddp"
    assert any(v["summary"]["comm_s"] > 0 for v in doc["variants"]), "DDP's final all-reduce is exposed"
    stored = _stored(tmp_path / "wavefront-results.sqlite", doc["run_id"])
    assert {row[0] for row in stored["runs"]} == {"baseline", "wavefront"} and stored["n_steps"] == 6
    assert "tokens/s (total)" in r.stdout and "CPU run" in r.stdout


def test_fsdp2_two_ranks_compare_with_checkpointing_and_trace(tmp_path):
    r = _train(tmp_path, "--nproc-per-node", "2", "--parallel", "fsdp2", "--compare", "--activation-checkpointing",
               "--profile-steps", "2", *SMALL, "--json", "out.json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    _check_kpis(doc, world=2, measured=1)
    for v in doc["variants"]:
        assert v["summary"]["hfu"] > v["summary"]["mfu"], "recompute adds hardware FLOPs"
        assert len(v["trace_paths"]) == 1
        trace = json.loads(Path(v["trace_paths"][0]).read_text())
        assert trace["traceEvents"], "the profiler trace has events"
    assert doc["provenance"]["parallel"] == "fsdp2"


def test_failing_rank_stops_the_job_with_a_clear_error(tmp_path):
    t0 = time.monotonic()
    r = _train(tmp_path, "--nproc-per-node", "2", "--no-patch", "--inject-failure", "1:1", *SMALL, timeout=180)
    assert r.returncode != 0
    assert time.monotonic() - t0 < 120, "a dead rank must not leave the others waiting for the full timeout"
    assert "rank 1 of 2, baseline step 1: RuntimeError: injected failure" in r.stderr
    assert "Traceback" not in r.stderr
    stored = _stored(tmp_path / "wavefront-results.sqlite", _run_ids(tmp_path)[0])
    assert stored["runs"][0][1].startswith("failed") and stored["n_steps"] == 1, "the measured step is kept"


def _run_ids(tmp_path: Path) -> list[str]:
    import sqlite3

    con = sqlite3.connect(tmp_path / "wavefront-results.sqlite")
    try:
        return [row[0] for row in con.execute("SELECT run_id FROM train_runs ORDER BY started_at")]
    finally:
        con.close()


def test_nan_loss_stops_every_rank(tmp_path):
    r = _train(tmp_path, "--no-patch", "--inject-nan", "1", *SMALL, "--global-batch", "2")
    assert r.returncode == 3
    assert "non-finite loss (nan) at step 1" in r.stderr


def test_bad_configuration_is_reported_before_any_work(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    runner = CliRunner()
    r = runner.invoke(build_app(), ["train", "--global-batch", "5", "--micro-batch", "2"])
    assert r.exit_code == 2
    assert "--global-batch 5 is not divisible by world size x micro-batch = 1 x 2 = 2" in " ".join(r.output.split())
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not (tmp_path / "wavefront-results.sqlite").exists()
    r = runner.invoke(build_app(), ["train", "--data", "missing.bin"])
    assert r.exit_code == 2 and "missing.bin' does not exist" in " ".join(r.output.split())


def test_resume_after_kill_continues_from_the_checkpoint(tmp_path):
    args = ["--no-patch", "--seq-len", "8", "--global-batch", "2", "--micro-batch", "1", "--steps", "4",
            "--warmup-steps", "0", "--store", ""]
    full = _train(tmp_path, *args, "--json", "full.json")
    assert full.returncode == 0, full.stderr[-2000:]
    full_losses = [s["loss"] for s in json.loads((tmp_path / "full.json").read_text())["variants"][0]["steps"]]

    ckpt = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "wavefront", "train", *args, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1",
           "--inject-failure", "0:3"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latest = ckpt / "baseline" / "latest"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() >= "step_000001":
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode != 0, "the run was killed (or stopped by the injected failure at step 3)"
    killed_at = int(latest.read_text().strip().removeprefix("step_"))
    assert 1 <= killed_at < 3

    resumed = _train(tmp_path, *args, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1", "--resume",
                     "--json", "resumed.json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    v = json.loads((tmp_path / "resumed.json").read_text())["variants"][0]
    assert v["resumed_from_step"] == killed_at
    assert [s["step"] for s in v["steps"]] == list(range(killed_at + 1, 4))
    losses = v["history_losses"][: killed_at + 1] + [s["loss"] for s in v["steps"]]
    assert losses == pytest.approx(full_losses, rel=1e-6, abs=1e-7), "no step lost or repeated"
