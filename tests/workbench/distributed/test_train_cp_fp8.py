"""`wavefront train --fp8` and `--cp`. FP8: the FP8 patch of the wavefront variant trains (finite losses
close to the bf16 baseline on the same batches) and the run reports MFU against the bf16 peak and against the
mixed FP8/bf16 peaks; bad FP8 options stop before any work with exit code 2. CP: two ranks holding zig-zag
shards of each sequence (ring attention) train to the one-process losses."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

TINY = ["--seq-len", "8", "--global-batch", "2", "--micro-batch", "1", "--steps", "2", "--store", ""]


def _train(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[3] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "wavefront", "train", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def test_fp8_rowwise_trains_close_to_bf16_and_reports_both_mfus(tmp_path):
    r = _train(tmp_path, "--compare", "baseline,wavefront", "--fp8", "rowwise", "--dtype", "bf16", "--gpu", "h100",
               *TINY, "--json", "out.json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    base, fp8 = doc["variants"]
    assert doc["config"]["fp8"] == "rowwise"
    assert fp8["patch_report"]["counts"]["fp8"] > 0, "the decoder's Linear layers must be FP8"
    losses = [s["loss"] for s in fp8["steps"]]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    # bf16 autocast over fp32 masters vs FP8 layers on bf16 weights: the same start, a few steps apart by no more
    # than FP8's ~4% relative operand rounding can move a loss near ln(vocab)
    assert max(abs(a - b["loss"]) for a, b in zip(losses, base["steps"], strict=True)) < 0.01
    s = fp8["summary"]
    assert s["fp8"]["fp8_peak_tflops"] == 1978.9 and s["fp8"]["bf16_peak_tflops"] == 989.4
    f8, f = s["fp8"]["flops_per_token"], s["flops_per_token"]
    assert 0 < f8 < f, "attention and the kept LM head stay at the bf16 peak"
    assert s["mfu"] == pytest.approx(s["tokens_per_s"] * f / (989.4e12))
    assert s["mfu_fp8"] == pytest.approx(s["tokens_per_s"] * (f8 / 1978.9 + (f - f8) / 989.4) / 1e12)
    assert s["mfu_fp8"] < s["mfu"], "FP8 FLOPs held against a peak twice as high"
    assert base["summary"]["mfu_fp8"] is None and base["summary"]["mfu"] > 0
    assert "MFU (fp8 mixed peaks)" in r.stdout and "fp8 rowwise:" in r.stdout


def test_bad_fp8_recipe_exits_2(tmp_path):
    r = _train(tmp_path, "--fp8", "fp4", *TINY, timeout=60)
    assert r.returncode == 2
    assert "'fp4' is not one of" in " ".join((r.stdout + r.stderr).split()) and "Traceback" not in r.stderr


@pytest.mark.parametrize("options, message", [
    (dict(fp8="fp4"), "--fp8 must be one of"),
    (dict(fp8="rowwise", dtype="fp32"), "--fp8 needs bf16 compute"),
    (dict(fp8="rowwise", dtype="bf16", variants=("baseline",)), "--fp8 patches the wavefront variant"),
])
def test_bad_fp8_configuration_is_refused_before_work(options, message):
    from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=message):
        TrainConfig(store=None, **options).validate(1)


def _losses(path: Path) -> list[float]:
    return [s["loss"] for s in json.loads(path.read_text())["variants"][0]["steps"]]


def _cp_parity(tmp_path: Path, steps: int) -> dict:
    args = ["--no-patch", "--seq-len", "8", "--global-batch", "2", "--micro-batch", "1", "--steps", str(steps),
            "--store", "", "--timeout", "60"]
    one = _train(tmp_path, *args, "--json", "one.json")
    assert one.returncode == 0, one.stderr[-3000:]
    cp = _train(tmp_path, "--nproc-per-node", "2", "--cp", "2", *args, "--json", "cp.json")
    assert cp.returncode == 0, cp.stderr[-3000:]
    want, got = _losses(tmp_path / "one.json"), _losses(tmp_path / "cp.json")
    assert len(got) == steps
    # fp32 on both sides; only the order of the attention's and the loss's sums differs (ring blocks merged by
    # log-sum-exp, the loss summed per shard then over the cp group)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    return json.loads((tmp_path / "cp.json").read_text())


@pytest.mark.slow  # 37 s; CP's layouts stay in the default suite: test_train_cp_mesh's cp 2 x tp 2 check
def test_cp2_loss_matches_one_process(tmp_path):
    """Two steps: the second step's loss checks the gradients summed over the cp group too."""
    doc = _cp_parity(tmp_path, steps=2)
    assert doc["provenance"]["layout"]["cp"] == 2


@pytest.mark.slow
def test_cp2_loss_matches_one_process_20_steps(tmp_path):
    _cp_parity(tmp_path, steps=20)


@pytest.mark.parametrize("options, message", [
    (dict(cp=2, seq_len=6), "not divisible by 2 x cp"),
    (dict(cp=2, model="tiny-gemma"), "Llama-like families"),
])
def test_bad_cp_layouts_are_refused(options, message):
    from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig

    world = 2
    with pytest.raises(ConfigError, match=message):
        TrainConfig(store=None, **options).validate(world)


def test_mixed_mfu_formula_and_missing_peaks():
    from wavefront.workbench.distributed.train import fp8 as train_fp8
    from wavefront.workbench.distributed.train.mesh import Layout, resolve
    from wavefront.workbench.hardware import get_gpu

    row = get_gpu("h100")
    flops = train_fp8.Fp8Flops("rowwise", 600.0, 4, *train_fp8.fp8_peak(row, None))
    # all 1000 FLOPs/token at the bf16 peak would give 1000 x tps / P; 600 of them go twice as fast
    tps = 1e9
    mixed = train_fp8.mixed_mfu(tps, 1000.0, flops, row.bf16_tflops, world_size=2)
    assert mixed == pytest.approx(tps * (600 / row.fp8_tflops + 400 / row.bf16_tflops) / 1e12 / 2)
    assert train_fp8.fp8_peak(None, None)[0] is None
    assert train_fp8.fp8_peak(None, 100.0)[0] is None, "one --peak-tflops cannot price both dtypes"
    assert train_fp8.fp8_peak(get_gpu("a100"), None) == (None, "none: NVIDIA A100 80GB SXM has no FP8 matrix path")
    assert train_fp8.mixed_mfu(tps, 1000.0, train_fp8.Fp8Flops("rowwise", 600.0, 4, None, "none"), 989.4, 1) is None
    # FSDP2 gives the FP8 layers bf16 weights (its param_dtype); a layout it does not wrap needs the cast: one
    # process, DDP (replicas only), tensor parallelism alone
    assert not train_fp8.needs_bf16_params(resolve("fsdp2", Layout(), 2, mesh_options=False).layout)
    assert train_fp8.needs_bf16_params(resolve("single", Layout(), 1, mesh_options=False).layout)
    assert train_fp8.needs_bf16_params(resolve("ddp", Layout(), 2, mesh_options=False).layout)
    assert not train_fp8.needs_bf16_params(Layout(dp_shard=2)) and not train_fp8.needs_bf16_params(
        Layout(tp=2, dp_shard=1, dp_replicate=2))
    assert train_fp8.needs_bf16_params(Layout(dp_shard=1)) and train_fp8.needs_bf16_params(Layout(tp=2, dp_shard=1))
