"""Expert parallelism in the training harness (``wavefront train --ep N``) and the MoE KPIs.

EP runs over the data-parallel ranks: consecutive groups of ``ep`` ranks (ranks ``[g ep, (g+1) ep)`` form ep
group g) each split every MoE layer's experts (``wavefront.parallel.expert_parallel``, rank r of a group holds
experts ``[r E/ep, (r+1) E/ep)``), while every rank still reads its own slice of the global batch. The expert
parameters are kept out of the dense gradient reduction (DDP ignores them, FSDP2 gets them as
``ignored_params``). Their gradient on a rank already sums the tokens of its whole ep group; the library's
default ``grad_scale = 1/ep`` turns that into the mean the averaged dense gradients use (each rank's loss is a
mean over its tokens). When ``ep`` is smaller than the data-parallel world, the ranks holding the same experts
(the same position in every ep group: ``r, r + ep, ...``) average the expert gradients after the last
micro-batch (:func:`reduce_grads`), so every parameter ends up averaged over all ranks.

Every rank creates every group (``new_group`` is collective), and the expert parameters are kept in model
order: a 4-rank ``--ep 2`` run once died in gloo ("Received data size doesn't match expected size") because
the expert gradients were all-reduced in the iteration order of a Python set, which follows object ids and so
differs between processes: one rank reduced a ``gate_up_proj`` gradient while its peer reduced a ``down_proj``.

KPIs: tokens routed to each expert per step (summed over all ranks) give the load imbalance, max / mean over
a layer's experts (1.0 = perfectly balanced), per layer and pooled over all layers. MFU of an MoE model
counts *active* parameters: a token passes through ``top_k`` of ``E`` experts, so the expert matmul
parameters count ``top_k / E`` of their size (:func:`active_matmul_params`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from wavefront.nn import tokens_per_expert
from wavefront.parallel import expert_parallel, expert_parameters
from wavefront.workbench.distributed.train.errors import ConfigError
from wavefront.workbench.distributed.train.mesh import Layout


def moe_shape(config) -> tuple[int, int] | None:
    """(experts per layer, experts per token) of an MoE transformers config, None for a dense one."""
    n_experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    return (int(n_experts), int(top_k)) if n_experts and top_k else None


def validate(ep: int, layout: Layout, variants: tuple[str, ...], config) -> None:
    """Raise ConfigError naming the problem; runs before any work. `layout`: the run's, resolved."""
    if ep < 1:
        raise ConfigError(f"--ep must be >= 1, got {ep}")
    if ep == 1:
        return
    data_parallel_only = layout.tp == layout.pp == layout.cp == 1 and 1 in (layout.dp_shard, layout.dp_replicate)
    if layout.dp < 2 or not data_parallel_only:
        raise ConfigError(f"--ep {ep} splits experts over the data-parallel ranks of --parallel ddp or fsdp2 (auto "
                          f"with several processes, or --dp-shard alone), not {layout.label()}")
    if layout.dp % ep:
        raise ConfigError(f"--ep {ep} must divide the data-parallel world size {layout.dp}")
    shape = moe_shape(config)
    if shape is None:
        raise ConfigError(f"--ep needs a mixture-of-experts model (tiny-mixtral, tiny-qwen3-moe, ...), got "
                          f"model type {config.model_type!r}")
    if shape[0] % ep:
        raise ConfigError(f"--ep {ep} must divide the number of experts per layer ({shape[0]})")
    if variants != ("wavefront",):
        raise ConfigError(f"--ep runs the wavefront variant only (its patch puts the experts into modules that "
                          f"expert parallelism splits), got {','.join(variants)}")


@dataclass
class EpState:
    ep: int
    group: object  # this rank's ep group
    replicas: object | None  # the ranks holding the same experts (None when ep == world)
    # this rank's expert Parameters in model order, the same on every rank: collectives over them must be issued
    # in one order everywhere (a set iterates in id() order, which differs between processes)
    params: list = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    # state-dict key of every expert weight (model order) -> its ExpertParallelExperts module
    weights: dict = field(default_factory=dict)


def _groups(ep: int, world: int, rank: int):
    """Every rank creates every group (new_group is collective); returns this rank's two."""
    mine = replicas = None
    for start in range(0, world, ep):
        g = dist.new_group(list(range(start, start + ep)))
        if start <= rank < start + ep:
            mine = g
    if ep < world:
        for offset in range(ep):
            g = dist.new_group(list(range(offset, world, ep)))
            if rank % ep == offset:
                replicas = g
    return mine, replicas


def install(model: torch.nn.Module, ep: int) -> EpState:
    """Split the experts of a patched MoE model over this rank's ep group, before DDP / FSDP2 wrap it."""
    group, replicas = _groups(ep, dist.get_world_size(), dist.get_rank())
    paths = expert_parallel(model, group)
    if not paths:
        raise RuntimeError("--ep: the model holds no wavefront MoE experts after patching")
    mine = {id(p) for p in expert_parameters(model)}
    weights = {f"{path}.{name}": model.get_submodule(path) for path in paths for name in ("gate_up_proj", "down_proj")}
    return EpState(ep, group, replicas, [p for p in model.parameters() if id(p) in mine], paths, weights)


def reduce_grads(state: EpState | None) -> None:
    """Average the expert gradients over the ranks that hold the same experts (after the last micro-batch): one
    all-reduce of all of them, flattened in model order (the same on every rank of the group)."""
    if state is None or state.replicas is None:
        return
    for p in state.params:  # every rank must send the same sizes, also one whose experts got no gradient
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in state.params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=state.replicas)
    flat.div_(dist.get_world_size(state.replicas))
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()


def _map_expert_states(optim_sd: dict, state: EpState | None, fn) -> dict:
    """`optim_sd` with fn(module, value) applied to every optimizer state of every expert weight, in model order
    and state-name order (the same on every rank: fn may be collective). The per-parameter dicts are copied, so
    the optimizer's own state is left alone."""
    if state is None:
        return optim_sd
    out = {**optim_sd, "state": dict(optim_sd["state"])}
    for key, module in state.weights.items():
        if key in out["state"]:
            entry = out["state"][key] = dict(out["state"][key])
            for name in sorted(entry):
                entry[name] = fn(module, entry[name])
    return out


def full_optim_state(optim_sd: dict, state: EpState | None, gather: bool = True) -> dict:
    """Checkpointing: `optim_sd` (what ``get_state_dict`` returns) with the expert weights' optimizer states
    (AdamW's exp_avg, exp_avg_sq) as full (E, ...) tensors, like the weights in the model state dict, so that
    DCP stores one copy per key and a run resumes with any --ep. gather: all-gathered over the ep group (saving;
    collective, the same order on every rank); else uninitialized (a buffer to load into)."""
    def full(module, local):
        if not isinstance(local, torch.Tensor) or local.dim() != 3:
            return local  # the step count (a scalar) is the same on every rank
        return module.gather_full(local) if gather else local.new_empty((module.num_experts, *local.shape[1:]))

    return _map_expert_states(optim_sd, state, full)


def local_optim_state(optim_sd: dict, state: EpState | None) -> dict:
    """Resuming: `optim_sd` with the full (E, ...) optimizer states of the expert weights cut to this rank's
    slice (the inverse of :func:`full_optim_state`)."""
    def local(module, value):
        return module.local_slice(value) if isinstance(value, torch.Tensor) else value

    return _map_expert_states(optim_sd, state, local)


def ddp_ignore(model: torch.nn.Module, state: EpState) -> None:
    """Tell DDP (before it wraps `model`) to leave the expert parameters out of its all-reduce."""
    from torch.nn.parallel import DistributedDataParallel  # lazy: torch submodule on use

    ids = {id(p) for p in state.params}
    names = [n for n, p in model.named_parameters() if id(p) in ids]
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)


def active_matmul_params(model: torch.nn.Module, n_matmul: int) -> int:
    """Matmul parameters a token passes through: the expert weights (full, before any split) count
    ``top_k / E`` of their size. `n_matmul` is :func:`kpi.matmul_params` of the same model."""
    shape = moe_shape(model.config)
    if shape is None:
        return n_matmul
    n_experts, top_k = shape
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in f".{n}.")
    return n_matmul - expert + expert * top_k // n_experts


def step_counts(model: torch.nn.Module, device: torch.device) -> dict[str, list[int]]:
    """Tokens routed to each (global) expert of each MoE layer during this step, summed over every rank;
    resets the counters. Empty for a model without wavefront MoE modules (every rank must call it)."""
    local = tokens_per_expert(model, reset=True)
    if not local:
        return {}
    names = sorted(local)
    flat = torch.tensor([c for n in names for c in local[n]], dtype=torch.float64, device=device)
    dist.all_reduce(flat)
    out, at = {}, 0
    for n in names:
        out[n] = [int(round(x)) for x in flat[at:at + len(local[n])].tolist()]
        at += len(local[n])
    return out


def imbalance(counts: dict[str, list[int]]) -> dict | None:
    """Load imbalance, max / mean tokens over a layer's experts: per layer, and pooled over all layers
    (the busiest expert of any layer over the mean of all). None without counts or tokens."""
    layers = {n: max(c) / (sum(c) / len(c)) for n, c in counts.items() if sum(c) > 0}
    pooled = [x for c in counts.values() for x in c]
    if not layers or not pooled:
        return None
    return {"overall": max(pooled) / (sum(pooled) / len(pooled)), "per_layer": layers}


def summarize(per_step: list[dict[str, list[int]]]) -> dict | None:
    """The run's figure: imbalance of the tokens summed over the given (measured) steps, and the worst step."""
    steps = [s for s in per_step if s]
    if not steps:
        return None
    total = {n: [sum(s[n][e] for s in steps) for e in range(len(steps[0][n]))] for n in steps[0]}
    out = imbalance(total)
    if out is None:
        return None
    worst = [imb["overall"] for imb in map(imbalance, steps) if imb is not None]
    return {**out, "worst_step_overall": max(worst), "tokens_per_expert": total}


def add_summary(summary, per_step: list[dict[str, list[int]]], state: EpState | None) -> None:
    """Fill the Summary's MoE fields (nothing for a dense model) and say how MFU counts parameters."""
    summary.moe = summarize(per_step)
    if summary.moe is None:
        return
    summary.moe_imbalance = summary.moe["overall"]
    summary.notes.append("MoE: MFU and HFU count active parameters (experts x top_k / E); imbalance = max / mean "
                         "tokens per expert over the measured steps" + (f"; experts split over ep {state.ep}"
                                                                          if state is not None else ""))
