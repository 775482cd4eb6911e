"""One function per parallel dimension, each applied to one module: the whole model, or one pipeline stage.

:func:`parallelize_stage` applies them in the fixed order TP, CP, EP, data parallelism (the pipeline cut
comes before, in parallelize.py), each a no-op where its degree is 1:

- **TP** (``tp``): tensor + sequence parallelism over ``mesh["tp"]`` (tensor_parallel.py). First, because it
  turns the weights into DTensors that FSDP2 then shards along a second mesh dimension (torchtitan's order).
- **CP** (``cp``): the model's attention becomes ring attention over ``mesh["cp"]`` (context_parallel.py); a
  setting of the model's config, shared by every stage cut from it, so it applies to the whole model.
- **EP** (``ep``): the experts of the patched MoE layers split over groups of ``ep`` data-parallel ranks
  (expert_parallel.py). Before data parallelism, which must leave the split experts out of its reduction.
- **data parallelism** (``dp_shard``, ``dp_replicate``): FSDP2 per decoder layer and at the root, HSDP when
  ``dp_replicate`` > 1; a layout that only replicates (``dp_shard`` = 1, nothing else split) is DDP. Last,
  because it wraps what the other dimensions left.

Each function reads its degree from the layout and records on :class:`Parallelized` what the training step
needs afterwards (partial gradients to sum, groups to reduce over, how to skip a gradient sync).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from wavefront.workbench.distributed.train import context_parallel, expert_parallel, tensor_parallel
from wavefront.workbench.distributed.train.fp8 import enable_all_gather
from wavefront.workbench.distributed.train.mesh import Layout
from wavefront.workbench.distributed.train.overlap import set_prefetch


@dataclass(frozen=True)
class ParallelOptions:
    """What the dimensions need besides the layout and the mesh."""

    bf16: bool = False  # FSDP2 computes in bf16 (its MixedPrecisionPolicy) and reduces in fp32
    reshard_after_forward: bool | int = True  # FSDP2 per decoder layer (overlap.py)
    prefetch: int = 0  # FSDP2 explicit prefetch depth in layers (overlap.py)
    fp8_all_gather: bool = False  # FSDP2 gathers the FP8 layers' weights in FP8 (fp8.py)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    # the pipeline's schedule: micro-batches per step, the loss's token count, the fused loss or eager's
    n_micro: int = 1
    n_items: int = 1
    patched: bool = False


@dataclass
class Parallelized:
    """What the training step needs to know about a parallelized module."""

    module: nn.Module  # what runs forward and backward, and what the optimizer and checkpoints see
    partial_grads: list[str] = field(default_factory=list)  # summed over tp after backward
    fsdp: bool = False
    ddp: bool = False
    root: nn.Module | None = None  # the whole model (a pipeline stage's module is part of it)
    pipe: Any = None  # pipeline.Pipeline when pp > 1
    ep: expert_parallel.EpState | None = None
    cp_group: Any = None
    notes: list[str] = field(default_factory=list)  # for the run's notes (what the FP8 all-gather wrapped)

    def sync_grads(self, sync: bool):
        """A context for one micro-batch's backward: reduce the gradients only when `sync` (the last one)."""
        if self.fsdp:
            self.module.set_requires_gradient_sync(sync)
        if self.ddp and not sync:
            return self.module.no_sync()
        return contextlib.nullcontext()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers FSDP2 wraps one by one: Hugging Face's ``_no_split_modules``, else ``*.layers.<i>``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if not names:
        return [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1].isdigit() and ".layers" in f".{n}"]
    return [m for m in model.modules() if type(m).__name__ in names]


def data_parallel_mesh(mesh, layout: Layout):
    """The mesh FSDP2 shards over: (dp_replicate, dp_shard) for HSDP, else dp_shard."""
    if layout.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]


def apply_tp(par: Parallelized, mesh, layout: Layout, opts: ParallelOptions) -> None:
    if layout.tp > 1:
        par.partial_grads = tensor_parallel.apply(par.module, mesh["tp"])


def apply_cp(par: Parallelized, mesh, layout: Layout, opts: ParallelOptions) -> None:
    if layout.cp > 1:
        par.cp_group = mesh["cp"].get_group()
        context_parallel.install(par.root if par.root is not None else par.module, par.cp_group)


def apply_ep(par: Parallelized, mesh, layout: Layout, opts: ParallelOptions) -> None:
    if layout.ep > 1:
        par.ep = expert_parallel.install(par.module, layout.ep)


def apply_data_parallel(par: Parallelized, mesh, layout: Layout, opts: ParallelOptions,
                        layers: list[nn.Module] | None = None) -> None:
    """FSDP2 (HSDP over replicas) per decoder layer and at the root, or DDP for a layout that only replicates."""
    if layout.dp == 1:
        return
    if layout.replicates_only:
        if par.ep is not None:
            expert_parallel.ddp_ignore(par.module, par.ep)
        device_ids = [opts.device.index or 0] if opts.device.type == "cuda" else None
        par.module, par.ddp = DistributedDataParallel(par.module, device_ids=device_ids), True
        return
    if opts.fp8_all_gather:  # before fully_shard: it wraps the weights FSDP2 then gathers
        par.notes += enable_all_gather(par.module, layout.dp_shard)
    dp_mesh = data_parallel_mesh(mesh, layout)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if opts.bf16 else \
        MixedPrecisionPolicy()
    ignored = set(par.ep.params) if par.ep is not None else None  # the split experts: expert_parallel.py
    layers = layers if layers is not None else decoder_layers(par.module)
    for layer in layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=opts.reshard_after_forward,
                    ignored_params=ignored)
    fully_shard(par.module, mesh=dp_mesh, mp_policy=mp, ignored_params=ignored)
    set_prefetch(layers, opts.prefetch)
    par.fsdp = True


def parallelize_stage(par: Parallelized, mesh, layout: Layout, opts: ParallelOptions,
                      layers: list[nn.Module] | None = None) -> Parallelized:
    """TP, CP, EP, then data parallelism on ``par.module`` (the model, or one pipeline stage with its `layers`)."""
    apply_tp(par, mesh, layout, opts)
    apply_cp(par, mesh, layout, opts)
    apply_ep(par, mesh, layout, opts)
    apply_data_parallel(par, mesh, layout, opts, layers)
    return par


def finish_backward(par: Parallelized, mesh, layout: Layout) -> None:
    """What the gradients need after the last micro-batch's backward: the tp sum of partial ones, the cp sum of
    every one (each cp rank's loss holds only its shard's tokens), the average of the split experts' ones."""
    if layout.tp > 1:
        tensor_parallel.reduce_partial_grads(par.module, par.partial_grads, mesh["tp"])
    if layout.cp > 1:
        context_parallel.reduce_grads(par.module, par.cp_group)
    expert_parallel.reduce_grads(par.ep)
