"""Worker for test_train_mesh: one forward/backward of a tiny model, tensor-parallel over 2 gloo ranks, with
wavefront patched in; prints one JSON line from rank 0 with each gradient's error against a float64
single-process run, the error of eager PyTorch in float32 (the accuracy rule's yardstick), and the
wavefront kernel launches on rank 0 next to those of one process.

Run as ``python tp_check.py MODEL`` (a script: its ranks fork from it once it has imported what they need)."""

from __future__ import annotations

import copy
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def _grads(model, ids, count: bool):
    from wavefront.kernels._launch import recording

    counts: dict[str, int] = {}
    with recording() as launches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    for launch in launches if count else ():
        counts[launch.name] = counts.get(launch.name, 0) + 1
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).double()
             for n, p in model.named_parameters()}
    return float(loss), grads, counts


def main(model_name: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    import wavefront
    from wavefront.workbench.distributed.train import tensor_parallel
    from wavefront.workbench.distributed.train.presets import build_model

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    base = build_model(model_name, seed=0, attn_implementation="sdpa")
    _, g64, _ = _grads(copy.deepcopy(base).double(), ids, False)
    _, g_eager, _ = _grads(copy.deepcopy(base), ids, False)
    one_counts: dict[str, int] = {}
    if dist.get_rank() == 0:  # the interpreter is slow: the one-process launch count on rank 0 only
        single = copy.deepcopy(base)
        wavefront.patch(single)
        _, _, one_counts = _grads(single, ids, True)
    tp = copy.deepcopy(base)
    wavefront.patch(tp)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    partial = tensor_parallel.apply(tp, mesh)
    _, g_tp, tp_counts = _grads(tp, ids, True)
    tensor_parallel.reduce_partial_grads(tp, partial, mesh)
    g_tp = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).double()
            for n, p in tp.named_parameters()}
    rows = {n: {"err": float((g_tp[n] - g64[n]).abs().max()), "eager": float((g_eager[n] - g64[n]).abs().max()),
                "scale": float(g64[n].abs().max())} for n in g64}
    if dist.get_rank() == 0:
        print(json.dumps({"grads": rows, "one_counts": one_counts, "tp_counts": tp_counts, "partial": partial}))
    dist.barrier()


if __name__ == "__main__":
    from wavefront.workbench.distributed.launch import spawn
    from wavefront.workbench.distributed.train.presets import PRESETS

    family = PRESETS[sys.argv[1]].model_type
    spawn(main, sys.argv[1], 2, preload=(f"transformers.models.{family}.modeling_{family}", "wavefront.kernels.*",
                                         "wavefront.workbench.distributed.train.tensor_parallel"))
