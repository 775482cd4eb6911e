"""Context parallelism combined with the other mesh dimensions, and the 3-D mesh.

- cp x tp: one float64 forward/backward on a cp 2 x tp 2 mesh (cp_check.py) gives one process's loss and
  gradients to rounding level, and the norms and the attention see the layouts the docstring of
  train/context_parallel.py promises (sequence-parallel norms on S / (cp tp) tokens, the attention on the
  whole zig-zag shard of S / cp tokens and tp's share of the heads);
- loss parity of ``wavefront train`` with one process (``convergence.loss_envelope``): CP2 x TP2 and
  CP2 x FSDP2 (4 processes each), CP2 x PP2 (cp inside each pipeline stage), and PP2 x TP2 x FSDP2 (8
  processes, the 3-D mesh); slow tests: each runs well over 30 s of interpreted kernels on a CPU;
- validation before any work."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_train_mesh import _assert_parity, _env, _losses, _train

pytest.importorskip("transformers")


def test_cp2_x_tp2_gradients_match_one_process_and_the_layouts_nest():
    worker = Path(__file__).with_name("cp_check.py")
    r = subprocess.run([sys.executable, str(worker)], env=_env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    # batch 2, sequence 8: each cp rank holds 4 tokens (two zig-zag chunks of 2); sequence parallelism splits
    # them over tp (2 tokens, hidden 32) and the attention sees the 4 tokens with 2 of the 4 query heads
    # (head dim 8: 16 columns).
    assert doc["seen"] == {"norm": [[2, 2, 32]], "attn_out": [[2, 4, 16]]}
    norms = [n for n in doc["grads"] if "norm" in n]
    assert sorted(doc["partial"]) == sorted(norms), "the norms' gradients are summed over tp, then cp"
    # float64 on both sides: only the order of the sums differs (ring merge, tp reduce-scatters, cp sums)
    for name, g in {**doc["grads"], "loss": doc["loss"]}.items():
        assert g["err"] <= 1e-12 * max(1.0, g["scale"]), (name, g)


@pytest.mark.parametrize(("world", "kw", "message"), [
    (4, {"cp": 2, "tp": 2, "seq_len": 6}, "--seq-len 6 is not divisible by 2 x cp = 4"),
    (8, {"cp": 4, "tp": 2, "seq_len": 12}, "--seq-len 12 is not divisible by 2 x cp = 8"),
    (4, {"cp": 2, "tp": 2, "model": "tiny-gemma"}, "Llama-like families"),
    (8, {"cp": 2, "tp": 4}, "--tp 4: the model's KV heads (2) is not divisible by 4"),
])
def test_bad_cp_mesh_layouts_are_refused_naming_the_numbers(world, kw, message):
    from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**{"seq_len": 16, "global_batch": 4, "micro_batch": 1, "store": None, **kw}).validate(world)


def test_good_cp_mesh_layouts_resolve():
    from wavefront.workbench.distributed.train.config import TrainConfig

    # zig-zag needs S % 2 cp, sequence parallelism S / cp % tp: 8 tokens fit cp 2 x tp 2 (2 per norm shard)
    TrainConfig(seq_len=8, global_batch=2, micro_batch=1, store=None, cp=2, tp=2).validate(4)
    TrainConfig(seq_len=8, global_batch=2, micro_batch=1, store=None, cp=2, dp_shard=2).validate(4)
    TrainConfig(seq_len=8, global_batch=4, micro_batch=1, store=None, cp=2, pp=2, tp=2).validate(8)


def test_pipeline_stages_hold_the_cp_shard_positions_and_shifted_targets():
    import torch

    from wavefront.workbench.distributed.train import context_parallel
    from wavefront.workbench.distributed.train.mesh import Layout
    from wavefront.workbench.distributed.train.pipeline import cut
    from wavefront.workbench.distributed.train.presets import build_model

    model = build_model("tiny-llama", seed=0)
    ids = torch.arange(16).reshape(2, 8)
    tokens, targets = context_parallel.pipeline_inputs(ids, 1, 2)
    # cp rank 1 of 2 holds chunks 1 and 2 of 4: positions 2, 3, 4, 5; the targets are the next tokens
    assert tokens.tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    assert targets.tolist() == [[3, 4, 5, 6], [11, 12, 13, 14]]
    _, last_targets = context_parallel.pipeline_inputs(ids, 0, 2)
    assert last_targets[:, -1].tolist() == [-100, -100], "no next token after the sequence's end"
    assert context_parallel.pipeline_inputs(ids, 0, 1) == (ids, None)
    for pp_rank in (0, 1):
        [(_, stage)] = cut(model, Layout(pp=2, cp=2), pp_rank, cp=(1, 2))
        assert stage._positions(4, ids.device).tolist() == [[2, 3, 4, 5]]
    [(_, stage)] = cut(model, Layout(pp=2), 0)
    assert stage._positions(8, ids.device).tolist() == [list(range(8))]


# ---- loss parity on gloo -----------------------------------------------------------------------------------


def _cp_parity(tmp_path: Path, steps: int, variants: str, layouts: list[tuple[int, list[str]]], *,
               global_batch: int = 2) -> dict[str, dict]:
    from wavefront.workbench.distributed.train.convergence import loss_envelope

    args = ["--model", "tiny-llama", "--compare", variants, "--steps", str(steps), "--seq-len", "8",
            "--global-batch", str(global_batch), "--warmup-steps", "0", "--lr", "1e-2", "--timeout", "300"]
    timeout = 900 if steps < 5 else 3600  # the 20-step runs interpret every kernel on a shared CPU
    ref = _losses(_train(tmp_path, *args, "--micro-batch", str(global_batch), name="single.json", timeout=timeout))
    envelope = loss_envelope("tiny-llama", steps=steps, seq_len=8, global_batch=global_batch, lr=1e-2)
    docs = {}
    for nproc, mesh_args in layouts:
        what = " ".join(mesh_args)
        doc = _train(tmp_path, *args, "--nproc-per-node", str(nproc), *mesh_args,
                     name=f"{what.replace(' ', '_').replace('-', '')}.json", timeout=timeout)
        assert doc["provenance"]["layout"]["world_size"] == nproc
        for variant, losses in _losses(doc).items():
            _assert_parity(ref[variant], losses, envelope, f"tiny-llama {what} {variant}")
        docs[what] = doc
    return docs


@pytest.mark.slow
def test_cp2_x_tp2_and_cp2_x_fsdp2_loss_parity_20_steps(tmp_path):
    docs = _cp_parity(tmp_path, 20, "baseline,wavefront", [
        (4, ["--cp", "2", "--tp", "2", "--micro-batch", "1"]),
        (4, ["--cp", "2", "--dp-shard", "2", "--micro-batch", "1"])])
    assert docs["--cp 2 --tp 2 --micro-batch 1"]["provenance"]["layout"]["cp"] == 2


@pytest.mark.slow
def test_cp2_x_pp2_loss_parity_20_steps(tmp_path):
    _cp_parity(tmp_path, 20, "baseline,wavefront", [(4, ["--cp", "2", "--pp", "2", "--micro-batch", "1"])],
               global_batch=4)


@pytest.mark.slow
def test_3d_mesh_pp2_x_tp2_x_fsdp2_loss_parity_20_steps(tmp_path):
    """8 processes: two pipeline stages (one layer each), each a tp 2 x dp_shard 2 mesh."""
    docs = _cp_parity(tmp_path, 20, "baseline,wavefront",
                      [(8, ["--pp", "2", "--tp", "2", "--dp-shard", "2", "--micro-batch", "1"])], global_batch=4)
    layout = next(iter(docs.values()))["provenance"]["layout"]
    assert (layout["pp"], layout["tp"], layout["dp_shard"]) == (2, 2, 2)
