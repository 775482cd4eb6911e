"""`wavefront train --ep` and the MoE KPIs. Two gloo ranks splitting tiny Mixtral's experts (EP2 over the
data-parallel ranks, experts out of the DDP all-reduce) train to the one-process losses, and their checkpoint
resumes in one process (slow: resumed EP2 repeats an uninterrupted EP2 run; 4 ranks with --ep 2, two ep groups
whose expert gradients are averaged, match one process within the derived envelope); the one-process run
reports the load imbalance (max / mean tokens per expert) per step, per layer and overall, from token counts
that add up to every routed (token, slot) pair; MFU counts active parameters; bad --ep values stop before any
work with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

# Only the MoE op patched: the expert split is what is under test, and the interpreter runs the other kernels
# slowly. Two steps: the second step's loss checks the expert and dense gradients of the first.
TINY = ["--model", "tiny-mixtral", "--patch-ops", "moe", "--seq-len", "8", "--global-batch", "2", "--micro-batch",
        "1", "--warmup-steps", "0", "--timeout", "60"]


def _train(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[3] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "wavefront", "train", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _variant(path: Path) -> dict:
    return json.loads(path.read_text())["variants"][0]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("ep_one")
    run = _train(tmp, *TINY, "--steps", "2", "--store", "store.sqlite", "--json", "one.json")
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp, run


def _ep_parity(tmp_path: Path, one: Path, steps: int, *extra: str) -> None:
    ep = _train(tmp_path, "--nproc-per-node", "2", "--ep", "2", *extra, *TINY, "--steps", str(steps), "--store", "",
                "--json", "ep.json")
    assert ep.returncode == 0, ep.stderr[-3000:]
    want, got = _variant(one), _variant(tmp_path / "ep.json")
    assert len(got["steps"]) == steps
    # fp32 on both sides; only the order of sums differs (each expert's gradient summed over the two ranks'
    # tokens by the reverse all-to-all, the dense gradients averaged by DDP / FSDP2), as the cp parity test
    assert [s["loss"] for s in got["steps"]] == pytest.approx([s["loss"] for s in want["steps"]][:steps],
                                                               rel=1e-5, abs=1e-5)
    # both runs route the same global batch: the same tokens reach the same experts
    assert got["summary"]["moe"]["tokens_per_expert"] == want["summary"]["moe"]["tokens_per_expert"]
    assert "experts split over ep 2" in " ".join(got["summary"]["notes"])


@pytest.fixture(scope="module")
def ep_two(one_process, tmp_path_factory) -> Path:
    """The EP2 run of the parity test, checkpointing after every step (DCP; expert weights and their AdamW
    states stored full, (E, ...))."""
    tmp = tmp_path_factory.mktemp("ep_two")
    _ep_parity(tmp, one_process[0] / "one.json", 2, "--checkpoint-dir", "ck", "--checkpoint-every", "1")
    return tmp


def test_ep2_loss_matches_one_process(ep_two):
    assert _variant(ep_two / "ep.json")["resumed_from_step"] is None


@pytest.mark.slow  # 25 s; the EP resume is also checked step-exact by the slow uninterrupted-run comparison
def test_ep2_checkpoint_resumes_in_one_process(ep_two, one_process, tmp_path):
    """The EP2 checkpoint after step 0 continues in one process without EP: the full expert weights and
    optimizer states load into the unsplit experts (a slice kept per rank, or one rank's states written for
    all, would fail to load or change step 1), and step 1 matches the uninterrupted one-process run."""
    import shutil

    shutil.copytree(ep_two / "ck", tmp_path / "ck")
    (tmp_path / "ck" / "wavefront" / "latest").write_text("step_000000")
    run = _train(tmp_path, *TINY, "--steps", "2", "--store", "", "--checkpoint-dir", "ck", "--resume", "--json",
                 "resumed.json")
    assert run.returncode == 0, run.stderr[-3000:]
    got, want = _variant(tmp_path / "resumed.json"), _variant(one_process[0] / "one.json")
    assert got["resumed_from_step"] == 0 and [s["step"] for s in got["steps"]] == [1]
    assert got["history_losses"] == [_variant(ep_two / "ep.json")["steps"][0]["loss"]]
    assert got["steps"][0]["loss"] == pytest.approx(want["steps"][1]["loss"], rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_ep2_resume_repeats_the_uninterrupted_run(tmp_path):
    """EP2 stopped after 2 steps and resumed with EP2 gives the third step of an uninterrupted EP2 run exactly
    (each rank's experts get back their own AdamW states)."""
    args = ["--nproc-per-node", "2", "--ep", "2", *TINY, "--store", ""]
    full = _train(tmp_path, *args, "--steps", "3", "--json", "full.json")
    assert full.returncode == 0, full.stderr[-3000:]
    for steps, extra in (("2", []), ("3", ["--resume"])):
        run = _train(tmp_path, *args, "--steps", steps, "--checkpoint-dir", "ck", "--checkpoint-every", "1", *extra,
                     "--json", "part.json")
        assert run.returncode == 0, run.stderr[-3000:]
    got = _variant(tmp_path / "part.json")
    assert got["resumed_from_step"] == 1
    assert got["history_losses"] + [s["loss"] for s in got["steps"]] == \
        [s["loss"] for s in _variant(tmp_path / "full.json")["steps"]]


@pytest.mark.slow
def test_ep2_under_fsdp2_loss_matches_one_process(tmp_path):
    one = _train(tmp_path, *TINY, "--steps", "3", "--store", "", "--json", "one.json")
    assert one.returncode == 0, one.stderr[-3000:]
    _ep_parity(tmp_path, tmp_path / "one.json", 3, "--parallel", "fsdp2")


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["ddp", "fsdp2"])
def test_ep2_on_four_ranks_matches_one_process(tmp_path, plan):
    """--ep 2 below the world size 4: two ep groups ({0, 1}, {2, 3}) each split the experts, the ranks holding
    the same experts ({0, 2}, {1, 3}) average their gradients. Two micro-batches per rank and step (gradient
    accumulation before the expert all-reduce). Within the derived envelope of the one-process losses."""
    from wavefront.workbench.distributed.train.convergence import loss_envelope

    args = [*TINY, "--global-batch", "8", "--lr", "1e-2", "--steps", "3", "--store", ""]
    one = _train(tmp_path, *args, "--json", "one.json", timeout=900)  # 24 sequences through the interpreter
    assert one.returncode == 0, one.stderr[-3000:]
    ep = _train(tmp_path, "--nproc-per-node", "4", "--ep", "2", "--parallel", plan, *args, "--json", "ep.json",
                timeout=900)
    assert ep.returncode == 0, ep.stderr[-3000:]
    want, got = _variant(tmp_path / "one.json"), _variant(tmp_path / "ep.json")
    envelope = loss_envelope("tiny-mixtral", steps=3, seq_len=8, global_batch=8, lr=1e-2)
    eps = torch.finfo(torch.float32).eps
    for t, (a, b, env) in enumerate(zip([s["loss"] for s in want["steps"]], [s["loss"] for s in got["steps"]],
                                        envelope, strict=True)):
        assert abs(a - b) <= 2 * env + 4 * eps * abs(a), (plan, t, a, b, env)
    assert got["summary"]["moe"]["tokens_per_expert"] == want["summary"]["moe"]["tokens_per_expert"]
    assert "experts split over ep 2" in " ".join(got["summary"]["notes"])
    assert json.loads((tmp_path / "ep.json").read_text())["provenance"]["world_size"] == 4


def test_moe_kpis_in_table_json_and_store(one_process):
    import sqlite3

    tmp, run = one_process
    v = _variant(tmp / "one.json")
    moe = v["summary"]["moe"]
    counts = moe["tokens_per_expert"]
    assert sorted(counts) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    for c in counts.values():  # 2 steps x 2 sequences x 8 tokens x top-2, over 4 experts
        assert len(c) == 4 and sum(c) == 2 * 2 * 8 * 2
    for layer, c in counts.items():
        assert moe["per_layer"][layer] == pytest.approx(max(c) / (sum(c) / 4))
    pooled = [x for c in counts.values() for x in c]
    assert v["summary"]["moe_imbalance"] == pytest.approx(max(pooled) / (sum(pooled) / len(pooled)))
    assert moe["worst_step_overall"] >= 1.0
    assert all(s["moe_imbalance"] is not None and s["moe_imbalance"] >= 1.0 for s in v["steps"])
    assert "MoE imbalance (max/mean)" in run.stdout and "count active parameters" in run.stdout
    con = sqlite3.connect(tmp / "store.sqlite")
    stored = json.loads(con.execute("SELECT summary_json FROM train_runs").fetchone()[0])
    assert stored["moe"]["tokens_per_expert"] == counts


def test_moe_mfu_counts_active_parameters():
    from wavefront.workbench.distributed.train.expert_parallel import active_matmul_params
    from wavefront.workbench.distributed.train.kpi import matmul_params
    from wavefront.workbench.distributed.train.presets import build_model

    model = build_model("tiny-mixtral")
    n = matmul_params(model)
    # per layer 4 experts of gate/up (2 x 64 x 32) and down (32 x 64); top-2 of 4 uses half of them
    experts = 2 * 4 * (2 * 64 * 32 + 32 * 64)
    assert active_matmul_params(model, n) == n - experts // 2
    assert active_matmul_params(build_model("tiny-llama"), 1000) == 1000


@pytest.mark.parametrize("args, message", [
    (["--ep", "3"], "--ep 3 must divide the data-parallel world size 2"),
    (["--ep", "2", "--model", "tiny-llama"], "--ep needs a mixture-of-experts model"),
])
def test_bad_ep_exits_2_before_work(tmp_path, monkeypatch, args, message):
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it: validated before a process group or model exists
    monkeypatch.setenv("RANK", "0")
    r = CliRunner().invoke(build_app(), ["train", "--model", "tiny-mixtral", *args])
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())
    assert text.startswith("error:") and message in text and "Traceback" not in r.output
    assert not (tmp_path / "wavefront-results.sqlite").exists(), "nothing ran"


@pytest.mark.parametrize("options, world, message", [
    (dict(ep=2, model="tiny-llama"), 2, "needs a mixture-of-experts model"),
    (dict(ep=2, variants=("baseline",)), 2, "wavefront variant only"),
    (dict(ep=8, global_batch=8, micro_batch=1), 8, "number of experts per layer"),
    (dict(ep=2), 1, "ddp or fsdp2"),
    (dict(ep=3, global_batch=6, micro_batch=1), 6, r"--ep 3 must divide the number of experts per layer \(4\)"),
    (dict(ep=4, global_batch=6, micro_batch=1), 6, "--ep 4 must divide the data-parallel world size 6"),
    (dict(ep=2, patch_options={"moe": False}), 2, "keep moe in --patch-ops"),
])
def test_bad_ep_configs_are_refused(options, world, message):
    from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=message):
        TrainConfig(store=None, **{"model": "tiny-mixtral", **options}).validate(world)


@pytest.mark.parametrize("ep, world, extra", [(2, 4, {}), (2, 8, {}), (4, 8, {}),
                                               (2, 2, {"checkpoint_dir": "ck", "checkpoint_every": 1})])
def test_ep_below_the_world_size_and_checkpointing_are_accepted(tmp_path, ep, world, extra):
    from wavefront.workbench.distributed.train.config import TrainConfig

    extra = {k: str(tmp_path / v) if k == "checkpoint_dir" else v for k, v in extra.items()}
    TrainConfig(store=None, model="tiny-mixtral", ep=ep, global_batch=world, micro_batch=1, **extra).validate(world)


def test_imbalance_of_counts():
    from wavefront.workbench.distributed.train.expert_parallel import imbalance, summarize

    assert imbalance({"a": [2, 2, 2, 2]})["overall"] == 1.0
    out = imbalance({"a": [4, 0, 0, 0], "b": [1, 1, 1, 1]})
    assert out["per_layer"] == {"a": 4.0, "b": 1.0}
    assert out["overall"] == pytest.approx(4 / (8 / 8))
    assert imbalance({"a": [0, 0]}) is None and summarize([{}, {}]) is None
    s = summarize([{"a": [3, 1]}, {"a": [1, 3]}])
    assert s["overall"] == 1.0 and s["worst_step_overall"] == 1.5 and s["tokens_per_expert"] == {"a": [4, 4]}
