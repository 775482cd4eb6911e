"""The loss applier: in training, the causal-LM loss goes through ``wavefront.ops.linear_cross_entropy``
and the [tokens x vocab] logits are never materialized.

How transformers computes the loss (4.4x-5.x, every family patched here): ``*ForCausalLM.forward`` runs
the decoder, computes ``logits = self.lm_head(hidden)`` (Gemma 2 then softcaps them) and, when ``labels``
are given, ``self.loss_function(logits, labels, vocab_size, **kwargs)``: labels shifted left by one with
``ignore_index`` (default -100) appended, or ``shift_labels`` used as given; cross-entropy in fp32;
``reduction="sum"`` divided by ``num_items_in_batch`` when given (gradient accumulation), else mean over
the non-ignored targets.

The instance-scoped route, no copy of the model's forward:

1. ``lm_head`` (a Linear) is swapped for :class:`FusedLossHead`, holding the same ``weight``/``bias``
   Parameters (state_dict unchanged, weight tying kept). Outside a fused call it is exactly ``F.linear``.
2. A forward pre-hook on the model (``with_kwargs=True``): when the model is in training mode and labels
   are given, it takes ``labels`` out of the call and hands them (with ``shift_labels``,
   ``num_items_in_batch``, ``ignore_index``) to the head. The model's forward then sees no labels and
   computes no loss of its own.
3. The head, called by the model's forward with the final hidden states, computes the loss with the
   fused kernel (Gemma 2's ``final_logit_softcapping`` passed as ``softcap``) and returns an empty
   ``[..., 0]`` logits tensor, so nothing of vocabulary size is allocated.
4. A forward hook puts the loss into the output (``output.loss``) and sets ``output.logits`` to None.

In eval mode, or without labels, nothing changes: full logits, transformers' own loss.

What the training loop can read besides the loss (the fused kernel never materializes the logits, so it is the
one place that sees every position's prediction): after each training forward with labels,
:func:`loss_metrics` (or the head's ``last_output``) holds a detached :class:`wavefront.ops.LossOutput` with
``token_accuracy`` (the fraction of non-ignored positions whose argmax is the label, computed in the kernel's
pass; ``head.metrics = False`` skips it, and the kernel's argmax variant with it) and ``z_loss`` (PaLM's
z-loss term at the head's ``z_loss`` coefficient, 0.0 by default: set ``head.z_loss = 1e-4`` to add it to
the training loss), divided by ``num_items_in_batch`` like the loss. The model output itself is
transformers' own class, which has no field for them.

Vocabulary-parallel heads (tensor parallelism, ``wavefront train --tp``): when the head's weight is a DTensor
sharded by vocabulary rows (``Shard(0)`` over one mesh dimension) and the head is marked
(:func:`vocab_parallel_head`), the loss is computed from this rank's rows and never from the whole logits:

- a :class:`FusedLossHead` (patched model) calls ``wavefront.parallel.vocab_parallel_linear_cross_entropy``
  on the local weight shard (chunked: not even the shard's [tokens x vocab / P] logits exist);
- a plain Linear (unpatched model) whose output is a DTensor sharded on the vocabulary (DTensor's
  ``ColwiseParallel`` with ``use_local_output=False``) gets a forward hook that computes
  ``wavefront.parallel.vocab_parallel_cross_entropy`` on the local [tokens x vocab / P] logits (upcast to
  fp32, as transformers' loss does), and the same pre-hook/hook pair on the model takes the labels in and
  puts the loss out.

Outside a training call with labels both return the whole logits (all-gathered), as an unsharded head would.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from wavefront import ops
from wavefront.parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy
from wavefront.patching.patcher import Hooks, Patcher
from wavefront.patching.report import Replacement, qualname

if TYPE_CHECKING:
    from wavefront.ops import LossOutput


@dataclass
class _LossCall:
    labels: torch.Tensor | None
    shift_labels: torch.Tensor | None
    ignore_index: int
    num_items_in_batch: torch.Tensor | int | None
    loss: torch.Tensor | None = None


class FusedLossHead(nn.Module):
    """An LM head that is ``F.linear`` normally and the fused linear cross-entropy inside a training call
    with labels. Holds the replaced Linear's own Parameters."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, softcap: float | None):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.softcap = softcap
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._call: _LossCall | None = None
        #: the weight is sharded by vocabulary rows over a process group (:func:`vocab_parallel_head`)
        self.vocab_parallel = False
        #: PaLM's z-loss coefficient added to the training loss (0: none)
        self.z_loss = 0.0
        #: compute the token accuracy (the kernel's argmax variant: 8 B more per token written, more registers)
        self.metrics = True
        #: the last training forward's loss, z-loss term and token accuracy, detached (:func:`loss_metrics`)
        self.last_output: LossOutput | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        call = self._call
        if call is None:
            if self.vocab_parallel:
                return _gathered_logits(hidden, self.weight, self.bias)
            return F.linear(hidden, self.weight, self.bias)
        out = fused_causal_lm_loss(hidden, self.weight, self.bias, call, self.softcap,
                                   vocab_parallel=self.vocab_parallel, z_loss=self.z_loss,
                                   accuracy=self.metrics)
        call.loss = out.loss
        self.last_output = out._replace(loss=out.loss.detach())
        return hidden.new_empty(*hidden.shape[:-1], 0)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, softcap={self.softcap}"


def shifted_targets(labels: torch.Tensor | None, shift_labels: torch.Tensor | None, ignore_index: int) -> torch.Tensor:
    """The next-token targets transformers' ForCausalLMLoss uses: labels[..., 1:] with ignore_index
    appended, or shift_labels as given; flattened."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1)


def _targets(call: _LossCall, n_positions: int, device: torch.device) -> torch.Tensor:
    target = shifted_targets(call.labels, call.shift_labels, call.ignore_index).to(device)
    if target.numel() != n_positions:
        raise ValueError(f"wavefront fused loss: {target.numel()} targets for {n_positions} positions; labels "
                         f"must have the shape of input_ids")
    return target


def _reduction(call: _LossCall) -> str:
    return "mean" if call.num_items_in_batch is None else "sum"


def _divided(loss: torch.Tensor, call: _LossCall) -> torch.Tensor:
    n = call.num_items_in_batch
    if n is not None:
        loss = loss / (n.to(loss.device) if torch.is_tensor(n) else n)
    return loss


def vocab_shard(t: torch.Tensor, what: str, dim: int = 0):
    """(local tensor, process group) of `t`, a DTensor sharded on `dim` over a one-dimensional mesh."""
    from torch.distributed.tensor import DTensor  # lazy: torch submodule on use

    def sharded_on_dim(p) -> bool:
        return p.is_shard() and p.dim % t.ndim == dim % t.ndim

    if not isinstance(t, DTensor) or t.device_mesh.ndim != 1 or not sharded_on_dim(t.placements[0]):
        placements = tuple(t.placements) if isinstance(t, DTensor) else "a plain tensor"
        raise ValueError(f"wavefront vocabulary-parallel loss: the LM head's {what} must be a DTensor sharded by "
                         f"vocabulary (Shard({dim})) over one mesh dimension, got {placements}")
    return t.to_local(), t.device_mesh.get_group()


def _gathered_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The whole logits of a vocabulary-sharded head (eval, no labels): local logits, all-gathered."""
    from torch.distributed.tensor import DTensor, Shard  # lazy: torch submodule on use

    w, _ = vocab_shard(weight, "weight")
    local = F.linear(hidden, w, None if bias is None else vocab_shard(bias, "bias")[0])
    return DTensor.from_local(local, weight.device_mesh, (Shard(-1),), run_check=False).full_tensor()


def fused_causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, call: _LossCall,
                         softcap: float | None, *, vocab_parallel: bool = False, z_loss: float = 0.0,
                         accuracy: bool | None = None) -> torch.Tensor | LossOutput:
    """The causal-LM loss of `hidden` through the head (weight, bias) without the logits; `vocab_parallel`:
    the head is this rank's vocabulary rows (a DTensor, see the module docstring). ``accuracy`` given: a
    LossOutput with the z-loss term (divided like the loss) and, if True, the token accuracy, both from the
    same pass."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    target = _targets(call, flat.shape[0], hidden.device)
    kw = dict(bias=bias, ignore_index=call.ignore_index, softcap=softcap, reduction=_reduction(call),
              z_loss=z_loss)
    metrics = accuracy is not None
    if metrics:
        kw.update(return_z_loss=True, return_token_accuracy=accuracy)
    if vocab_parallel:
        w, group = vocab_shard(weight, "weight")
        kw["bias"] = None if bias is None else vocab_shard(bias, "bias")[0]
        loss = vocab_parallel_linear_cross_entropy(flat, w, target, group, **kw)
    else:
        loss = ops.linear_cross_entropy(flat, weight, target, **kw)
    if metrics:
        return loss._replace(loss=_divided(loss.loss, call), z_loss=_divided(loss.z_loss, call))
    return _divided(loss, call)


def loss_metrics(model: nn.Module) -> LossOutput | None:
    """The last training forward's detached (loss, z-loss term, None, token accuracy) of `model`'s fused loss head,
    or None when the model has none (not patched, or its loss not fused) or it has not run with labels yet.
    Finds the head inside wrappers (DDP, FSDP2, torch.compile) by walking the modules."""
    for module in model.modules():
        if isinstance(module, FusedLossHead):
            return module.last_output
    return None


def vocab_parallel_logits_loss(logits: torch.Tensor, call: _LossCall, group,
                               softcap: float | None = None) -> torch.Tensor:
    """The causal-LM loss from this rank's vocabulary shard of the logits [..., V / P] (upcast to fp32 as
    transformers' ForCausalLMLoss does; `softcap`: the model's final-logit softcapping, which the model would
    apply to the logits after the head)."""
    rows = logits.reshape(-1, logits.shape[-1]).float()
    target = _targets(call, rows.shape[0], logits.device)
    loss = vocab_parallel_cross_entropy(rows, target, group, ignore_index=call.ignore_index, softcap=softcap,
                                        reduction=_reduction(call))
    return _divided(loss, call)


class _ShardedLogitsLoss:
    """Forward hook on a Linear LM head whose output is a DTensor sharded on the vocabulary: inside a training
    call with labels, the loss from the local logits (returned local); otherwise the whole logits. Holds the
    ``_call`` the model's hooks hand over, like :class:`FusedLossHead`."""

    def __init__(self, softcap: float | None):
        self._call: _LossCall | None = None
        self.softcap = softcap

    def __call__(self, module, args, out):
        local, group = vocab_shard(out, "logits", dim=out.ndim - 1)
        call = self._call
        if call is None:
            return out.full_tensor()
        call.loss = vocab_parallel_logits_loss(local, call, group, self.softcap)
        return local


def vocab_parallel_head(model: nn.Module, head_name: str) -> None:
    """Compute `model`'s training loss from its vocabulary-sharded LM head `head_name` (module docstring): a
    :class:`FusedLossHead` is switched to the vocabulary-parallel fused loss; a Linear whose output is a
    vocabulary-sharded DTensor gets the logits hook and the model the labels hooks. Not reversible (the
    head's weight is already a shard)."""
    head = model.get_submodule(head_name)
    if isinstance(head, FusedLossHead):
        head.vocab_parallel = True
        return
    if not isinstance(head, nn.Linear):
        raise TypeError(f"vocab_parallel_head: '{head_name}' must be a torch.nn.Linear or a wavefront "
                        f"FusedLossHead, got {type(head).__name__}")
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    carrier = _ShardedLogitsLoss(float(softcap) if softcap else None)
    head.register_forward_hook(carrier)
    model.register_forward_pre_hook(_TakeLabels(carrier), with_kwargs=True)
    model.register_forward_hook(_PutLoss(carrier), with_kwargs=True)


class _TakeLabels:
    """Forward pre-hook on the model: in training with labels, hand the labels to the head and call the
    model's forward without them. A class (not a closure) so that a patched model deep-copies and pickles."""

    def __init__(self, head: FusedLossHead | _ShardedLogitsLoss):
        self.head = head

    def __call__(self, module, args, kwargs):
        head = self.head
        head._call = None
        if not module.training:
            return None
        bound = inspect.signature(type(module).forward).bind_partial(module, *args, **kwargs)
        labels = bound.arguments.get("labels")
        extra = dict(bound.arguments.get("kwargs", {}))
        shift_labels = extra.get("shift_labels")
        if labels is None:  # as in transformers: no labels, no loss (shift_labels alone computes none)
            return None
        head._call = _LossCall(labels, shift_labels, int(extra.get("ignore_index", -100)),
                               extra.get("num_items_in_batch"))
        bound.arguments["labels"] = None
        extra.pop("shift_labels", None)
        extra.pop("ignore_index", None)
        if "kwargs" in bound.arguments:
            bound.arguments["kwargs"] = extra
        return bound.args[1:], bound.kwargs


class _PutLoss:
    """Forward hook on the model: the fused loss into ``output.loss``, ``output.logits`` None."""

    def __init__(self, head: FusedLossHead | _ShardedLogitsLoss):
        self.head = head

    def __call__(self, module, args, kwargs, output):
        head = self.head
        call, head._call = head._call, None
        if call is None:
            return None
        if call.loss is None:
            raise RuntimeError("wavefront fused loss: the model's forward did not call its LM head")
        if isinstance(output, tuple):
            return (call.loss, *output[1:])
        loss = call.loss
        aux = output.get("aux_loss")
        if aux is not None and hasattr(module, "router_aux_loss_coef"):
            # MoE models add their router's load-balancing loss to the LM loss (output_router_logits=True).
            loss = loss + module.router_aux_loss_coef * aux.to(loss.device)
        fields = {k: v for k, v in output.items() if k not in ("loss", "logits")}
        return type(output)(loss=loss, logits=None, **fields)


def apply_loss(p: Patcher) -> None:
    rule = p.family.loss
    if rule is None:
        p.absent("loss", f"{p.family.name} models have no causal-LM head")
        return
    if not hasattr(ops, "linear_cross_entropy"):
        p.unmatched("loss", "wavefront.ops.linear_cross_entropy is not available in this build of wavefront")
        return
    model = p.model
    if type(model).__name__ not in rule.classes:
        p.unmatched("loss", f"the model is a {type(model).__name__}, not one of {', '.join(rule.classes)} (only "
                            f"the causal-LM head's loss is fused)")
        return
    old = getattr(model, rule.head, None)
    if type(old) is not nn.Linear:
        p.unmatched("loss", f"expected '{rule.head}' to be a torch.nn.Linear, got {type(old).__name__}", rule.head)
        return
    if "labels" not in inspect.signature(type(model).forward).parameters:
        p.unmatched("loss", f"{type(model).__name__}.forward takes no 'labels' in transformers "
                            f"{p.report.transformers_version}")
        return
    softcap = getattr(model.config, rule.softcap_from, None) if rule.softcap_from else None
    head = FusedLossHead(old.weight, old.bias, float(softcap) if softcap else None)
    p.swap_module("loss", rule.head, head)
    handles = (model.register_forward_pre_hook(_TakeLabels(head), with_kwargs=True),
               model.register_forward_hook(_PutLoss(head), with_kwargs=True))
    p.record(Hooks(tuple(h.id for h in handles)))
    p.report.replacements.append(Replacement("loss", "", qualname(type(model)),
                                             "forward (pre-)hooks: labels -> fused head", "hooks"))
