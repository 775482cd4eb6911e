"""Worker for test_planner_recompute_measured: micro-batches in flight on each stage of a PP2 1F1B pipeline
(train/pipeline.py over 2 gloo ranks, a 4-layer tiny Llama, 4 micro-batches), two ways:

- counted: each micro-batch forward of the rank's stage adds one, each backward takes one away (the
  schedule's PipelineStage calls); the maximum;
- in bytes: the peak live bytes of one measured step (live-bytes meter, gradients allocated by a first
  step), over the bytes one micro-batch's forward leaves on this stage.

Prints one JSON line per rank. Run as ``python pp_inflight.py`` (its ranks fork from it once it has imported
what they need).
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

N_MICRO, MICRO, SEQ = 4, 2, 32
DIMS = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=8)


def main() -> None:
    from wavefront.workbench.bench.live_bytes import LiveBytesMeter
    from wavefront.workbench.distributed.train import mesh as train_mesh
    from wavefront.workbench.distributed.train import pipeline
    from wavefront.workbench.distributed.train.mesh import Layout
    from wavefront.workbench.distributed.train.presets import build_model

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    layout = Layout(1, 2, 1, 1, 1, 1, "1f1b", "test").resolved(2)
    mesh = train_mesh.build_mesh(layout, "cpu")
    model = build_model("tiny-llama", seed=0, attn_implementation="sdpa", **DIMS)
    model.config.use_cache = False
    ids = torch.randint(0, 8, (N_MICRO * MICRO, SEQ), generator=torch.Generator().manual_seed(1))
    pipe, par = pipeline.build(model, mesh, layout, bf16=False, device=torch.device("cpu"), n_micro=N_MICRO,
                               n_items=ids.numel(), patched=False)
    stage = par.module[0]
    count = {"now": 0, "max": 0}
    pipe_stage = pipe.pipe_stages[0]
    fwd_chunk, bwd_chunk = pipe_stage.forward_one_chunk, pipe_stage.backward_one_chunk

    def forward_one_chunk(*args, **kwargs):
        out = fwd_chunk(*args, **kwargs)
        count["now"] += 1
        count["max"] = max(count["max"], count["now"])
        return out

    def backward_one_chunk(*args, **kwargs):
        out = bwd_chunk(*args, **kwargs)
        count["now"] -= 1
        return out

    pipe_stage.forward_one_chunk, pipe_stage.backward_one_chunk = forward_one_chunk, backward_one_chunk
    pipe.step(ids)
    for p in stage.parameters():
        p.grad.zero_()
    count["max"] = 0
    with LiveBytesMeter() as meter:
        pipe.step(ids)
    rank = dist.get_rank()
    x = ids[:MICRO] if rank == 0 else torch.randn(MICRO, SEQ, DIMS["hidden_size"], requires_grad=True)
    with LiveBytesMeter() as one:
        out = stage(x)
    del out
    print(json.dumps({"rank": rank, "inflight_counted": count["max"], "peak_bytes": meter.result.peak_bytes,
                      "per_micro_batch_bytes": one.result.live_bytes, "n_micro": N_MICRO}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    from wavefront.workbench.distributed.launch import spawn

    spawn(lambda _: main(), None, 2, preload=("wavefront.workbench.distributed.train.pipeline",
                                              "wavefront.workbench.distributed.train.presets"))
