"""`wavefront train --fp8 rowwise --fp8-all-gather`: the FSDP2 FP8 weight all-gather in the training harness.
The losses equal the run without the flag bit for bit (the gathered FP8 copies hold exactly the values the op
quantizes from the bf16 gather, tests/parallel/test_fp8_fsdp.py), so the derived tolerance is zero; options the
all-gather cannot run with stop before any work with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

TINY = ["--seq-len", "8", "--global-batch", "2", "--micro-batch", "1", "--steps", "3", "--store", "", "--dtype",
        "bf16", "--timeout", "120"]


def _train(tmp_path: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[3] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "wavefront", "train", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _steps(path: Path) -> list[float]:
    return [s["loss"] for s in json.loads(path.read_text())["variants"][0]["steps"]]


@pytest.mark.slow
def test_fp8_all_gather_losses_equal_the_bf16_gather(tmp_path):
    """Two 2-rank FSDP2 runs (--dp-shard 2), rowwise FP8, three AdamW steps: with and without the flag."""
    runs = {}
    for name, extra in (("base", []), ("gather", ["--fp8-all-gather"])):
        r = _train(tmp_path, "--nproc-per-node", "2", "--dp-shard", "2", "--fp8", "rowwise", *TINY, *extra,
                   "--json", f"{name}.json")
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = r
    assert "weights gathered in FP8 over 2 FSDP2 ranks" in " ".join(runs["gather"].stdout.split())
    base, ours = _steps(tmp_path / "base.json"), _steps(tmp_path / "gather.json")
    assert len(ours) == 3
    assert ours == base


@pytest.mark.parametrize("options, world, message", [
    (dict(fp8_all_gather=True), 2, "pass --fp8 RECIPE too"),
    (dict(fp8="mxfp8", fp8_all_gather=True, dtype="bf16", parallel="fsdp2"), 2, "recipe mxfp8 has no FP8 all-gather"),
    (dict(fp8="rowwise", fp8_all_gather=True, dtype="bf16", parallel="ddp"), 2, "is an FSDP2 option"),
    (dict(fp8="rowwise", fp8_all_gather=True, dtype="bf16", tp=2), 2, "needs FSDP2 sharding only"),
    (dict(fp8="rowwise", fp8_all_gather=True, dtype="bf16", parallel="fsdp2", reshard_after_forward="2"), 4,
     "--reshard-after-forward must be true or false"),
])
def test_bad_all_gather_configuration_is_refused_before_work(options, world, message):
    from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=message):
        TrainConfig(store=None, **options).validate(world)


def test_all_gather_configuration_accepted():
    from wavefront.workbench.distributed.train.config import TrainConfig

    for options in (dict(parallel="fsdp2"), dict(dp_shard=2)):
        TrainConfig(store=None, fp8="rowwise", fp8_all_gather=True, dtype="bf16", **options).validate(2)


def test_all_gather_without_fp8_exits_2(tmp_path):
    r = _train(tmp_path, "--fp8-all-gather", *TINY, timeout=120)
    assert r.returncode == 2
    assert "pass --fp8 RECIPE too" in " ".join((r.stdout + r.stderr).split()) and "Traceback" not in r.stderr
