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
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wavefront.patching.patcher import Hooks, Patcher
from wavefront.patching.report import Replacement, qualname


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

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        call = self._call
        if call is None:
            return F.linear(hidden, self.weight, self.bias)
        call.loss = fused_causal_lm_loss(hidden, self.weight, self.bias, call, self.softcap)
        return hidden.new_empty(*hidden.shape[:-1], 0)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, softcap={self.softcap}"


def shifted_targets(labels: torch.Tensor | None, shift_labels: torch.Tensor | None, ignore_index: int) -> torch.Tensor:
    """The next-token targets transformers' ForCausalLMLoss uses: labels[..., 1:] with ignore_index
    appended, or shift_labels as given; flattened."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1)


def fused_causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, call: _LossCall,
                         softcap: float | None) -> torch.Tensor:
    from wavefront import ops

    target = shifted_targets(call.labels, call.shift_labels, call.ignore_index).to(hidden.device)
    flat = hidden.reshape(-1, hidden.shape[-1])
    if target.numel() != flat.shape[0]:
        raise ValueError(f"wavefront fused loss: {target.numel()} targets for {flat.shape[0]} positions; labels "
                         f"must have the shape of input_ids")
    n = call.num_items_in_batch
    reduction = "mean" if n is None else "sum"
    loss = ops.linear_cross_entropy(flat, weight, target, bias=bias, ignore_index=call.ignore_index,
                                    softcap=softcap, reduction=reduction)
    if n is not None:
        loss = loss / (n.to(loss.device) if torch.is_tensor(n) else n)
    return loss


class _TakeLabels:
    """Forward pre-hook on the model: in training with labels, hand the labels to the head and call the
    model's forward without them. A class (not a closure) so that a patched model deep-copies and pickles."""

    def __init__(self, head: FusedLossHead):
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

    def __init__(self, head: FusedLossHead):
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
    from wavefront import ops

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
