"""Apply a mesh layout to a model: tensor + sequence parallelism over ``tp``, then FSDP2 over the
data-parallel dimensions (HSDP when ``dp_replicate`` > 1), in torchtitan's order (TP first, so FSDP2
shards the tensor-parallel DTensors along a second mesh dimension).

Pipeline parallelism cuts the model first (pipeline.py) and calls :func:`parallelize` on each stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from wavefront.workbench.distributed.train import tensor_parallel
from wavefront.workbench.distributed.train.mesh import Layout
from wavefront.workbench.distributed.train.overlap import set_prefetch


@dataclass
class Parallelized:
    """What the training step needs to know about a parallelized module."""

    module: nn.Module
    partial_grads: list[str] = field(default_factory=list)  # summed over tp after backward
    fsdp: bool = False


def data_parallel_mesh(mesh, layout: Layout):
    """The mesh FSDP2 shards over: (dp_replicate, dp_shard) for HSDP, else dp_shard."""
    if layout.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    if not names:
        return [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1].isdigit() and ".layers" in f".{n}"]
    return [m for m in model.modules() if type(m).__name__ in names]


def parallelize(model: nn.Module, mesh, layout: Layout, *, bf16: bool, layers: list[nn.Module] | None = None,
                reshard_after_forward: bool | int = True, prefetch: int = 0) -> Parallelized:
    """TP/SP over ``mesh["tp"]`` when tp > 1, then FSDP2 per decoder layer and at the root when dp > 1
    (``reshard_after_forward`` and explicit ``prefetch`` of that many layers: overlap.py)."""
    out = Parallelized(model)
    if layout.tp > 1:
        out.partial_grads = tensor_parallel.apply(model, mesh["tp"])
    if layout.dp > 1:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # lazy: torch-free import

        dp_mesh = data_parallel_mesh(mesh, layout)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
            MixedPrecisionPolicy()

        layers = layers if layers is not None else decoder_layers(model)
        for layer in layers:
            fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp)
        set_prefetch(layers, prefetch)
        out.fsdp = True
    return out


def finish_backward(p: Parallelized, mesh, layout: Layout) -> None:
    """What the gradients need after the last micro-batch's backward: the tp sum of partial ones."""
    if layout.tp > 1:
        tensor_parallel.reduce_partial_grads(p.module, p.partial_grads, mesh["tp"])
