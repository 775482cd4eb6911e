"""`wavefront train`: bad input refused before any work (exit 2, an error line, no traceback), --resume's
fallback to the last intact checkpoint, and --compare over the variants users would pick instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

TINY = ["--seq-len", "8", "--global-batch", "1", "--micro-batch", "1", "--steps", "2", "--warmup-steps", "0"]


def _invoke(tmp_path: Path, monkeypatch, *args: str):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    return CliRunner().invoke(build_app(), ["train", *args])


@pytest.mark.parametrize(("args", "message"), [
    (["--json", "afile/out.json"], "--json: cannot write 'afile/out.json': a file is in the path"),
    (["--checkpoint-dir", "afile", "--checkpoint-every", "1"], "--checkpoint-dir: 'afile' is a file, not a directory"),
    (["--store", "adir"], "--store: 'adir' is a directory"),
    (["--compare", "eager,jax"], "--compare: unknown variant(s) jax"),
    (["eager,wavefront"], "variants are given with --compare"),
    (["--compare", "eager,baseline"], "'baseline' and 'eager' are the same"),
])
def test_bad_input_exits_2_before_any_work(tmp_path, monkeypatch, args, message):
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "adir").mkdir()
    r = _invoke(tmp_path, monkeypatch, *args)
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    text = " ".join(r.stderr.split())
    assert text.startswith("error:") and message in text and "Traceback" not in r.output
    assert not (tmp_path / "wavefront-results.sqlite").exists(), "nothing ran"


def _checkpoint(root: Path, step: int) -> Path:
    import torch.distributed.checkpoint as dcp

    path = root / f"step_{step:06d}"
    dcp.save({"w": torch.full((4,), float(step))}, checkpoint_id=str(path), no_dist=True)
    (root / f"step_{step:06d}.json").write_text(json.dumps({"step": step, "losses": [1.0] * (step + 1)}))
    (root / "latest").write_text(path.name)
    return path


def test_resume_falls_back_to_the_last_intact_checkpoint_and_says_so(tmp_path):
    from wavefront.workbench.distributed.train.checkpoint import resume_point

    _checkpoint(tmp_path, 1)
    newest = _checkpoint(tmp_path, 3)
    assert resume_point(tmp_path).meta["step"] == 3 and resume_point(tmp_path).note is None
    shards = list(newest.glob("*.distcp"))
    assert shards
    shards[0].unlink()
    point = resume_point(tmp_path)
    assert point.meta["step"] == 1 and point.meta["path"].endswith("step_000001")
    assert f"step_000003 (shard {shards[0].name} is missing)" in point.note
    assert "resuming from the last intact checkpoint step_000001 (after step 1)" in point.note


def test_resume_without_checkpoint_says_it_starts_at_step_0(tmp_path):
    from wavefront.workbench.distributed.train.checkpoint import resume_point

    point = resume_point(tmp_path / "empty")
    assert point.meta is None and "no checkpoint under" in point.note and "starting at step 0" in point.note
    newest = _checkpoint(tmp_path, 2)
    (newest / ".metadata").unlink()
    point = resume_point(tmp_path)
    assert point.meta is None and "step_000002 (it has no .metadata)" in point.note
    assert "starting at step 0" in point.note


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[3] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _compare(tmp_path: Path, variants: str) -> dict:
    cmd = [sys.executable, "-m", "wavefront", "train", "--compare", variants, *TINY, "--store", "", "--json", "o.json"]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / "o.json").read_text())


def test_compare_eager_liger_wavefront_side_by_side(tmp_path):
    doc = _compare(tmp_path, "eager,liger,wavefront")
    assert doc["schema"] == "wavefront.train/1"
    by_name = {v["variant"]: v for v in doc["variants"]}
    assert [v["variant"] for v in doc["variants"]][-1] == "liger", "Liger runs last (it rebinds module functions)"
    for name in ("eager", "wavefront"):
        assert by_name[name]["status"] == "ok" and by_name[name]["summary"]["tokens_per_s"] > 0
        assert by_name[name]["summary"]["peak_mem_bytes"] > 0 and len(by_name[name]["steps"]) == 2
    if by_name["liger"]["status"] == "ok":
        assert by_name["liger"]["summary"]["tokens_per_s"] > 0
    else:
        assert by_name["liger"]["status"].startswith("skipped: Liger-Kernel is not installed")
        assert "liger" not in doc["comparisons"]
    assert by_name["wavefront"]["patch_report"]["ok"] and by_name["eager"]["patch_report"] is None
    assert doc["comparison"] == doc["comparisons"]["wavefront"]
    assert doc["comparisons"]["wavefront"]["max_abs_loss_diff"] < 1e-4, "same data, same start, same losses"


@pytest.mark.slow
def test_compare_with_torch_compile(tmp_path):
    doc = _compare(tmp_path, "eager,compile")
    eager, compiled = doc["variants"]
    assert compiled["variant"] == "compile" and compiled["status"] == "ok"
    assert doc["comparisons"]["compile"]["max_abs_loss_diff"] < 1e-4
    assert [s["step"] for s in compiled["steps"]] == [s["step"] for s in eager["steps"]]


def _train(tmp_path: Path, *args: str) -> dict:
    cmd = [sys.executable, "-m", "wavefront", "train", "--no-patch", *TINY, "--store", "", "--json", "r.json", *args]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp_path / "r.json").read_text())["variants"][0]


@pytest.mark.slow
def test_resume_end_to_end_no_checkpoint_then_a_missing_shard(tmp_path):
    ckpt = ["--checkpoint-dir", "ck", "--checkpoint-every", "1", "--resume"]
    first = _train(tmp_path, *ckpt)
    assert first["resumed_from_step"] is None and [s["step"] for s in first["steps"]] == [0, 1]
    assert any("no checkpoint under ck/baseline yet; starting at step 0" in n for n in first["notes"])
    newest = tmp_path / "ck" / "baseline" / "step_000001"
    next(newest.glob("*.distcp")).unlink()
    second = _train(tmp_path, *ckpt, "--steps", "3")
    assert second["resumed_from_step"] == 0 and [s["step"] for s in second["steps"]] == [1, 2]
    assert any("skipped step_000001" in n and "last intact checkpoint step_000000" in n for n in second["notes"])
