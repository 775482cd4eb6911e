"""Pipeline parallelism: stages cut from a Hugging Face causal LM and run by a
``torch.distributed.pipelining`` schedule (1F1B, GPipe, interleaved 1F1B, interleaved zero-bubble, ZBV).

Cutting: the model's ``L`` decoder layers go to ``S = pp x vpp`` stages in order, the first ``L mod S``
stages one layer more (uneven counts allowed, at least one layer each); the embedding is placed on stage 0,
the final norm and LM head on stage S - 1, the rotary table (no parameters) on every stage. A stage keeps
the original module paths (``model.layers.3.mlp.up_proj.weight``), so checkpoints and tensor-parallel
plans see the same names as in the whole model. Stages are placed on pipeline ranks in a loop (stage
``s`` on rank ``s mod pp``) or, for ZBV, in a V (rank ``r`` holds ``r`` and ``2 pp - 1 - r``).

Each stage's forward calls the decoder layers exactly as the model's own forward does (position
embeddings from the rotary table, a causal mask left to the sdpa/wavefront attention). The loss is summed
cross-entropy over next-token targets divided by the tokens of the whole step on this data-parallel rank,
so gradients equal the one-process mean; with wavefront patched, the loss uses ``wavefront.ops.cross_entropy``.
With tensor parallelism, stage boundaries carry the local sequence shard (plain tensors on the wire).
With context parallelism (cp inside each stage, train/context_parallel.py) every stage holds the zig-zag
shard of its cp rank: the first stage embeds the shard's tokens, every stage rotates with the shard's global
positions, the attention is the ring over the cp group (the same group for every stage of a pipeline rank),
and the last stage's loss takes the targets shifted on the whole sequence, then sharded (-100 after the
sequence's last token), so the cp ranks' losses add up to the unsharded one.

Bubble: the schedule's wall time minus the time this rank spends in its stages' forward and backward
(module hooks), i.e. waiting for peers and point-to-point transfers, the pipeline's idle time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining
from torch.distributed.tensor import DTensor, Shard

from wavefront import ops
from wavefront.parallel import shard_sequence
from wavefront.workbench.distributed.train.dimensions import Parallelized, ParallelOptions, parallelize_stage
from wavefront.workbench.distributed.train.mesh import PP_SCHEDULES, Layout


def split_layers(n_layers: int, n_stages: int) -> list[range]:
    """Layer indices per stage: in order, the first ``n_layers mod n_stages`` stages one more."""
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"cannot cut {n_layers} layers into {n_stages} stages (each needs at least one)")
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        size = base + (s < extra)
        out.append(range(start, start + size))
        start += size
    return out


def stages_of_rank(pp_rank: int, layout: Layout) -> list[int]:
    if layout.pp_schedule == "zbv":
        return [pp_rank, 2 * layout.pp - 1 - pp_rank]
    return [pp_rank + k * layout.pp for k in range(layout.vpp)]


#: Schedules that split backward into input and weight gradients (module backward hooks would not see it).
ZERO_BUBBLE = ("interleaved-zb", "zbv")


class Stage(nn.Module):
    """Part of a ``*ForCausalLM``: ``model.embed_tokens`` (first), ``model.layers.<i>`` (a ModuleDict keyed
    by the original index), ``model.norm`` and ``lm_head`` (last), ``model.rotary_emb``."""

    def __init__(self, whole: nn.Module, layers: range, first: bool, last: bool, tp_mesh=None,
                 cp: tuple[int, int] = (0, 1)):
        super().__init__()
        self.config = whole.config
        base = whole.model
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(i): base.layers[i] for i in layers})
        self.model.rotary_emb = base.rotary_emb
        if first:
            self.model.embed_tokens = base.embed_tokens
        if last:
            self.model.norm = base.norm
            self.lm_head = whole.lm_head
        self.first, self.last, self.tp_mesh = first, last, tp_mesh
        self.cp_rank, self.cp = cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            h = self.model.embed_tokens(x)
        elif self.tp_mesh is not None:
            h = DTensor.from_local(x, self.tp_mesh, (Shard(1),), run_check=False)
        else:
            h = x
        position_ids = self._positions(h.shape[1], x.device)
        cos_sin = self.model.rotary_emb(h if not hasattr(h, "to_local") else h.to_local(), position_ids)
        for layer in self.model.layers.values():
            h = layer(h, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
        if self.last:
            return self.lm_head(self.model.norm(h))
        return h.to_local() if hasattr(h, "to_local") else h

    def _positions(self, n_local: int, device) -> torch.Tensor:
        """[1, n_local]: the global positions of this rank's tokens (its zig-zag shard under cp)."""
        positions = torch.arange(n_local * self.cp, device=device)
        if self.cp > 1:
            positions = shard_sequence(positions, self.cp_rank, self.cp, 0)
        return positions.unsqueeze(0)


def cut(whole: nn.Module, layout: Layout, pp_rank: int, tp_mesh=None,
        cp: tuple[int, int] = (0, 1)) -> list[tuple[int, Stage]]:
    """(stage index, stage module) of the stages this pipeline rank runs."""
    if not hasattr(whole, "model") or not hasattr(whole.model, "layers"):
        raise ValueError(f"pipeline cutting expects a *ForCausalLM with model.layers, got {type(whole).__name__}")
    ranges = split_layers(len(whole.model.layers), layout.n_stages)
    last = layout.n_stages - 1
    return [(s, Stage(whole, ranges[s], s == 0, s == last, tp_mesh, cp)) for s in stages_of_rank(pp_rank, layout)]


@dataclass
class BusyClock:
    """Seconds this rank spends inside its stages' forward and backward (module hooks)."""

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    _starts: list[float] = field(default_factory=list)

    def attach(self, module: nn.Module, backward: bool) -> None:
        module.register_forward_pre_hook(lambda m, a: self._start())
        module.register_forward_hook(lambda m, a, o: self._stop("fwd_s"))
        if backward:
            module.register_full_backward_pre_hook(lambda m, g: self._start())
            module.register_full_backward_hook(lambda m, gi, go: self._stop("bwd_s"))

    def _start(self) -> None:
        self._starts.append(time.perf_counter())

    def _stop(self, into: str) -> None:
        if self._starts:
            setattr(self, into, getattr(self, into) + time.perf_counter() - self._starts.pop())


def causal_lm_loss(n_items: int, patched: bool, shifted: bool = False):
    """loss_fn(logits, ids) for the last stage: summed next-token cross-entropy / n_items; `shifted`: the
    target is already the next token of each position (-100 where there is none: context parallelism)."""

    def loss_fn(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if shifted:
            pred, target = logits.reshape(-1, logits.shape[-1]).float(), ids.reshape(-1)
        else:
            pred = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
            target = ids[:, 1:].reshape(-1)
        if patched:
            return ops.cross_entropy(pred, target, reduction="sum") / n_items
        return F.cross_entropy(pred, target, reduction="sum") / n_items

    return loss_fn


class Pipeline:
    """The schedule over this rank's stages; :meth:`step` runs one optimizer step's forward and backward."""

    def __init__(self, stages: list[tuple[int, nn.Module]], layout: Layout, pp_group, device, n_micro: int,
                 loss_fn):
        self.layout, self.n_micro = layout, n_micro
        self.clock = BusyClock()
        self.pipe_stages = []
        for index, module in stages:
            self.clock.attach(module, backward=layout.pp_schedule not in ZERO_BUBBLE)
            self.pipe_stages.append(pipelining.PipelineStage(module, index, layout.n_stages, device, group=pp_group))
        cls = getattr(pipelining, _schedule_class(layout))
        if layout.pp_schedule in ("1f1b", "gpipe"):
            self.schedule = cls(self.pipe_stages[0], n_micro, loss_fn=loss_fn, scale_grads=False)
        else:
            self.schedule = cls(self.pipe_stages, n_micro, loss_fn=loss_fn, scale_grads=False)
        self.has_first = any(s.is_first for s in self.pipe_stages)
        self.has_last = any(s.is_last for s in self.pipe_stages)

    def step(self, ids: torch.Tensor, target: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, float, float, float | None]:
        """(summed loss on the last stage's rank else 0, wall, forward busy, backward busy seconds or None
        when the schedule splits backward so module hooks cannot time it). `target`: the loss's targets
        (default `ids`: the loss shifts them)."""
        losses: list[torch.Tensor] = []
        self.clock.fwd_s = self.clock.bwd_s = 0.0
        t0 = time.perf_counter()
        args = (ids,) if self.has_first else ()
        target = ids if target is None else target
        self.schedule.step(*args, target=target if self.has_last else None, losses=losses)
        wall = time.perf_counter() - t0
        loss = torch.stack([x.detach() for x in losses]).sum() if losses else torch.zeros((), device=ids.device)
        fwd = min(self.clock.fwd_s, wall)
        if self.layout.pp_schedule in ZERO_BUBBLE:  # backward not observable per module: no bubble measurement
            return loss.double(), wall, fwd, None
        return loss.double(), wall, fwd, min(self.clock.bwd_s, wall - fwd)


def build(whole: nn.Module, mesh, layout: Layout, *, bf16: bool, device, n_micro: int, n_items: int,
          patched: bool):
    """(Pipeline, Parallelized over this rank's stages held in one ModuleList) for this pipeline rank: the cut,
    then every other dimension on each stage (dimensions.py)."""
    opts = ParallelOptions(bf16=bf16, device=device, n_micro=n_micro, n_items=n_items, patched=patched)
    return build_stages(whole, mesh, layout, opts)


def build_stages(whole: nn.Module, mesh, layout: Layout, opts: ParallelOptions) -> tuple[Pipeline, Parallelized]:
    tp_mesh = mesh["tp"] if layout.tp > 1 else None
    stages = cut(whole, layout, mesh["pp"].get_local_rank(), tp_mesh, (mesh["cp"].get_local_rank(), layout.cp))
    pars = [parallelize_stage(Parallelized(m, root=whole), mesh, layout, opts, layers=list(m.model.layers.values()))
            for _, m in stages]
    holder = nn.ModuleList([m for _, m in stages])
    names = [f"{i}.{n}" for i, par in enumerate(pars) for n in par.partial_grads]
    pipe = Pipeline(stages, layout, mesh["pp"].get_group(), opts.device, opts.n_micro,
                    causal_lm_loss(opts.n_items, opts.patched, shifted=layout.cp > 1))
    return pipe, Parallelized(holder, names, any(p.fsdp for p in pars), root=whole, pipe=pipe,
                              cp_group=pars[0].cp_group)


def _schedule_class(layout: Layout) -> str:
    return PP_SCHEDULES[layout.pp_schedule]
