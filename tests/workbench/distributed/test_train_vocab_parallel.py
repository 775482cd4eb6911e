"""The vocabulary-parallel LM head of ``wavefront train --tp``: the head's weight sharded by vocabulary rows over
the tensor-parallel group, the loss computed from the local shard (``vocab_parallel_cross_entropy`` on local
logits unpatched, the fused ``vocab_parallel_linear_cross_entropy`` patched), tied heads sharing the sharded
embedding table.

Each case trains a tiny model (vocabulary 512, 64 tokens a step, so the logits are the largest tensor of a
step) TP2 on gloo next to one process: the losses agree step by step within the derived envelope
(``convergence.loss_envelope``: twice the spread of rounding-perturbed fp32 runs around float64, plus 4 ulps),
the first step's gradients and eval-mode logits (gathered whole, no labels) pass the accuracy rule against
float64, and the largest tensor any op returns on a rank during forward and backward is the shard's logits
[tokens, vocab / 2]: one process's largest is the whole [tokens, vocab]."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

EPS32 = 2.0 ** -23
HERE = Path(__file__).resolve().parent


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(HERE.parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _model_dir(tmp_path: Path, preset: str, **overrides) -> str:
    from wavefront.workbench.distributed.train.presets import build_config

    path = tmp_path / preset
    build_config(preset, vocab_size=512, **overrides).save_pretrained(path)
    return str(path)


def _check(tmp_path: Path, preset: str, steps: int, variants: str, **overrides) -> None:
    model = _model_dir(tmp_path, preset, **overrides)
    r = subprocess.run([sys.executable, str(HERE / "vocab_tp_check.py"), model, str(steps), variants], env=_env(),
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    docs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [d["variant"] for d in docs] == variants.split(",")
    from wavefront.workbench.distributed.train.convergence import loss_envelope

    run = docs[0]["run"]
    envelope = loss_envelope(model, steps=steps, seq_len=run["seq_len"], global_batch=run["global_batch"],
                             lr=run["lr"])
    for d in docs:
        what = f"{preset} {d['variant']}"
        for t, (a, b, env) in enumerate(zip(d["single"], d["losses"], envelope, strict=True)):
            tol = 2 * env + 4 * EPS32 * abs(a)
            assert abs(a - b) <= tol, f"{what} step {t}: |{b} - {a}| = {abs(a - b):.3g} > {tol:.3g}"
        for name, g in d["grads"].items():
            assert g["err"] <= 2 * g["eager"] + 4 * EPS32 * g["scale"], (what, name, g)
        tokens, vocab = d["tokens"], d["vocab"]
        ev = d["eval_logits"]
        assert ev["shape"] == [2, tokens // 2, vocab], "eval without labels returns the whole logits"
        assert ev["err"] <= 2 * ev["eager"] + 4 * EPS32 * ev["scale"], (what, ev)
        assert d["head_local_shape"] == [vocab // 2, 32], "rank 0 holds half the head's rows"
        assert d["tied"] == bool(overrides.get("tie_word_embeddings")), "a tied head shares the embedding table"
        shard_logits = tokens * (vocab // 2) * 4
        assert d["max_bytes"] <= shard_logits, f"{what}: a tensor larger than the shard's logits on rank 0"
        if d["variant"] == "baseline":
            assert d["head_type"] == "Linear"
            assert d["max_bytes"] == shard_logits, "the local logits are the largest tensor of the step"
            assert d["single_max_bytes"] == 2 * shard_logits, "one process holds the whole logits"
        else:
            assert d["head_type"] == "FusedLossHead"


def test_tp2_vocab_parallel_head_trains_like_one_process(tmp_path):
    """Unpatched tiny Llama, 3 steps (the patched head's TP2 gradients are also checked against float64 by
    test_train_mesh's kernel test; the patched curves here are slow)."""
    _check(tmp_path, "tiny-llama", 3, "baseline")


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "overrides"), [
    ("tiny-llama", {}),
    ("tiny-qwen3", {}),
    ("tiny-qwen3", {"tie_word_embeddings": True}),
])
def test_tp2_vocab_parallel_head_patched_and_unpatched(tmp_path, preset, overrides):
    _check(tmp_path, preset, 4, "baseline,wavefront", **overrides)


def test_tied_heads_run_under_tp_and_are_refused_under_pp(tmp_path):
    """Tensor parallelism shards the tied table once (the embedding's and the head's rows are the same);
    a pipeline would put the embedding and the head on different stages."""
    from wavefront.workbench.distributed.train.config import ConfigError
    from wavefront.workbench.distributed.train.mesh import Layout, validate
    from wavefront.workbench.distributed.train.presets import build_config

    tied = build_config("tiny-qwen3", tie_word_embeddings=True)
    assert validate(Layout(tp=2), 2, tied, seq_len=8, global_batch=2, micro_batch=1).tp == 2
    with pytest.raises(ConfigError, match="--pp: the model ties its embedding and LM head weights"):
        validate(Layout(pp=2), 2, tied, seq_len=8, global_batch=2, micro_batch=1)
    with pytest.raises(ConfigError, match=r"--tp 2: the model's vocabulary \(129\) is not divisible by 2"):
        validate(Layout(tp=2), 2, build_config("tiny-llama", vocab_size=129), seq_len=8, global_batch=2,
                 micro_batch=1)


@pytest.mark.slow
def test_tied_head_through_the_cli_on_tp2_x_fsdp2(tmp_path):
    """`wavefront train --tp 2 --dp-shard 2` (4 processes) on a tied tiny Qwen3, patched and unpatched: the
    sharded tied table under FSDP2 trains like one process."""
    model = _model_dir(tmp_path, "tiny-qwen3", tie_word_embeddings=True)
    args = ["-m", "wavefront", "train", "--model", model, "--compare", "baseline,wavefront", "--steps", "2",
            "--seq-len", "8", "--global-batch", "2", "--warmup-steps", "0", "--lr", "1e-2", "--timeout", "300",
            "--store", ""]
    docs = {}
    for name, extra in (("single", ["--micro-batch", "2"]),
                        ("mesh", ["--nproc-per-node", "4", "--tp", "2", "--dp-shard", "2", "--micro-batch", "1"])):
        r = subprocess.run([sys.executable, *args, *extra, "--json", f"{name}.json"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        docs[name] = {v["variant"]: [s["loss"] for s in v["steps"]] for v in doc["variants"]}
    from wavefront.workbench.distributed.train.convergence import loss_envelope

    envelope = loss_envelope(model, steps=2, seq_len=8, global_batch=2, lr=1e-2)
    for variant, ref in docs["single"].items():
        for t, (a, b, env) in enumerate(zip(ref, docs["mesh"][variant], envelope, strict=True)):
            assert abs(a - b) <= 2 * env + 4 * EPS32 * abs(a), (variant, t, a, b, env)
