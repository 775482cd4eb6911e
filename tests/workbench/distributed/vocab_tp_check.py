"""Worker for test_train_vocab_parallel: a tiny model trained tensor-parallel over 2 gloo ranks with the
vocabulary-parallel LM head, unpatched (local logits + vocab_parallel_cross_entropy) and patched (fused
vocab_parallel_linear_cross_entropy), against one process. Rank 0 prints one JSON line per variant:

- ``losses``/``single``: the loss of every step of TP2 and of one process (same corpus, batches, AdamW as
  ``convergence.loss_envelope``), for the step-by-step parity check;
- ``grads``: the first step's gradient errors against a float64 single process, and eager fp32's (the accuracy
  rule's yardstick);
- ``max_bytes`` / ``single_max_bytes``: the largest tensor any op returned on rank 0 during the first step's
  forward and backward, TP2 and one process (DTensors counted by their local shard);
- ``head_local_shape``: rank 0's rows of the LM head weight;
- ``eval_logits``: eval-mode logits without labels on a held-out batch before training (the head gathers them
  whole), their error against float64 and eager fp32's.

Run as ``python vocab_tp_check.py MODEL_DIR STEPS VARIANTS`` (VARIANTS: "baseline,wavefront" or one of them; a
script: its ranks fork from it once it has imported what they need)."""

from __future__ import annotations

import copy
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SEQ_LEN, GLOBAL_BATCH, LR = 32, 2, 1e-2


def _full(g):
    return (g.full_tensor() if hasattr(g, "full_tensor") else g).double()


def _eval_logits(model, ids):
    """Eval mode, no labels: the whole logits (a vocabulary-parallel head all-gathers them), in float64."""
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.double()


def _train(model, batches, steps: int, partial=None, mesh=None):
    """(losses, first step's gradients, largest tensor of the first step) of AdamW training."""
    from wavefront.workbench.bench.live_bytes import LargestTensorMeter
    from wavefront.workbench.distributed.train import tensor_parallel

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    losses, grads, max_bytes = [], {}, 0
    for step in range(steps):
        ids = batches.micro_batch(step, 0, 1, 0, GLOBAL_BATCH)
        measure = LargestTensorMeter() if step == 0 else None
        with measure if measure is not None else torch.enable_grad():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        if measure is not None:
            max_bytes = measure.max_bytes
        if mesh is not None:
            tensor_parallel.reduce_partial_grads(model, partial, mesh)
        if step == 0:
            grads = {n: _full(p.grad) for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().double()))
    return losses, grads, max_bytes


def main(model_dir: str, steps: int, variants: list[str]) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    import wavefront
    from wavefront.workbench.distributed.train import tensor_parallel
    from wavefront.workbench.distributed.train.data import Batches, synthetic_corpus
    from wavefront.workbench.distributed.train.presets import build_model

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    base = build_model(model_dir, seed=0, attn_implementation="sdpa")
    corpus = synthetic_corpus(base.config.vocab_size, max(1 << 16, 2 * SEQ_LEN * GLOBAL_BATCH), seed=0)
    batches = Batches(corpus, SEQ_LEN, GLOBAL_BATCH)
    _, g64, _ = _train(copy.deepcopy(base).double(), batches, 1)
    held_out = torch.stack([batches.sample(10_000 + i) for i in range(GLOBAL_BATCH)])
    logits64 = _eval_logits(copy.deepcopy(base).double(), held_out)
    eager_err = float((_eval_logits(copy.deepcopy(base), held_out) - logits64).abs().max())
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    for variant in variants:
        single = copy.deepcopy(base)
        if variant == "wavefront":
            wavefront.patch(single)
        one_losses, g_one, one_max = _train(single, batches, steps)
        g_eager = g_one if variant == "baseline" else _train(copy.deepcopy(base), batches, 1)[1]
        tp = copy.deepcopy(base)
        if variant == "wavefront":
            wavefront.patch(tp)
        partial = tensor_parallel.apply(tp, mesh)
        logits = _eval_logits(tp, held_out)
        eval_logits = {"shape": list(logits.shape), "err": float((logits - logits64).abs().max()), "eager": eager_err,
                       "scale": float(logits64.abs().max())}
        head = tp.lm_head.weight
        tied = head is tp.model.embed_tokens.weight
        losses, g_tp, max_bytes = _train(tp, batches, steps, partial, mesh)
        rows = {n: {"err": float((g_tp[n] - g64[n]).abs().max()), "eager": float((g_eager[n] - g64[n]).abs().max()),
                    "scale": float(g64[n].abs().max())} for n in g_tp}
        if dist.get_rank() == 0:
            print(json.dumps({"variant": variant, "losses": losses, "single": one_losses, "grads": rows,
                              "eval_logits": eval_logits, "max_bytes": max_bytes, "single_max_bytes": one_max,
                              "tied": tied,
                              "head_local_shape": list(head.to_local().shape), "head_type": type(tp.lm_head).__name__,
                              "tokens": SEQ_LEN * GLOBAL_BATCH, "vocab": base.config.vocab_size,
                              "run": {"seq_len": SEQ_LEN, "global_batch": GLOBAL_BATCH, "lr": LR}}), flush=True)
    dist.barrier()


if __name__ == "__main__":
    from pathlib import Path

    from wavefront.workbench.distributed.launch import spawn

    family = json.loads((Path(sys.argv[1]) / "config.json").read_text())["model_type"]
    spawn(lambda a: main(a[0], a[1], a[2].split(",")), (sys.argv[1], int(sys.argv[2]), sys.argv[3]), 2,
          preload=(f"transformers.models.{family}.modeling_{family}", "wavefront.kernels.*",
                   "wavefront.workbench.distributed.train.data",
                   "wavefront.workbench.distributed.train.tensor_parallel"))
