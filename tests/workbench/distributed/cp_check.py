"""Worker for test_train_cp_mesh: one forward/backward of tiny Llama in float64 on a cp 2 x tp 2 mesh of 4
gloo ranks (ring attention over the cp group on each tp rank's heads, sequence-parallel norms on a further tp
split of the zig-zag shard); prints one JSON line from rank 0 with the loss's and each gradient's error
against a float64 single-process run and the local sequence lengths the norms and the attention saw. In
float64 the ring runs on the reference blocks: what is checked is the bookkeeping of the nested layouts (a
misplaced token, position or gradient sum shows far above rounding), quickly; the kernels' fp32 numerics
are the slow loss-parity tests' and tests/parallel's.

Run as ``python cp_check.py`` (a script: its ranks fork from it once it has imported what they need)."""

from __future__ import annotations

import copy
import json

import torch
import torch.distributed as dist

CP, TP, BATCH, SEQ = 2, 2, 2, 8


def _full(g: torch.Tensor) -> torch.Tensor:
    return (g.full_tensor() if hasattr(g, "full_tensor") else g).double()


def _one_process(model, ids):
    """Loss and gradients of one process, the loss in float64 (transformers' own loss would round float64
    logits to float32)."""
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    return float(loss.detach()), {n: _full(p.grad) for n, p in model.named_parameters()}


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from wavefront.workbench.distributed.train import context_parallel, tensor_parallel
    from wavefront.workbench.distributed.train.presets import build_model

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    ids = torch.randint(0, 128, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    base = build_model("tiny-llama", seed=0, attn_implementation="sdpa")
    base = base.double()
    loss64, g64 = _one_process(copy.deepcopy(base), ids)

    mesh = init_device_mesh("cpu", (CP, TP), mesh_dim_names=("cp", "tp"))
    cp_rank = mesh["cp"].get_local_rank()
    model = copy.deepcopy(base)
    context_parallel.install(model, mesh["cp"].get_group())
    partial = tensor_parallel.apply(model, mesh["tp"])
    seen: dict[str, list] = {}

    def record(name):
        def hook(mod, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            seen.setdefault(name, []).append(list((x.to_local() if hasattr(x, "to_local") else x).shape))
        return hook

    layer = model.model.layers[0]
    layer.input_layernorm.register_forward_pre_hook(record("norm"), with_kwargs=True)
    layer.self_attn.o_proj.register_forward_pre_hook(record("attn_out"), with_kwargs=True)
    # the harness's shard (tokens, global positions, targets shifted on the whole sequence); the loss in float64
    # here, where the harness's goes through transformers' (fp32 logits) with shift_labels
    local, positions, targets = context_parallel.shard(ids, cp_rank, CP)
    logits = model(input_ids=local, position_ids=positions).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                                             reduction="sum") / (BATCH * (SEQ - 1))
    loss.backward()
    tensor_parallel.reduce_partial_grads(model, partial, mesh["tp"])
    context_parallel.reduce_grads(model, mesh["cp"].get_group())
    total = loss.detach().double().clone()
    dist.all_reduce(total, group=mesh["cp"].get_group())  # the cp shards' losses add up to the whole one
    rows = {n: {"err": float((_full(p.grad) - g64[n]).abs().max()), "scale": float(g64[n].abs().max())}
            for n, p in model.named_parameters()}
    report = {"grads": rows, "partial": partial, "seen": seen,
              "loss": {"err": abs(float(total) - loss64), "scale": abs(loss64)}}
    if dist.get_rank() == 0:
        print(json.dumps(report))
    dist.barrier()


if __name__ == "__main__":
    from wavefront.workbench.distributed.launch import spawn

    spawn(lambda _: main(), None, CP * TP, preload=("transformers.models.llama.modeling_llama",
                                                   "wavefront.workbench.distributed.train.context_parallel",
                                                   "wavefront.workbench.distributed.train.tensor_parallel"))
