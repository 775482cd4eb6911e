"""The MoE applier: sparse MoE blocks route with ``ops.moe_router`` and run their experts as
``moe_permute -> grouped_linear (SwiGLU) -> grouped_linear -> moe_unpermute``.

transformers 5.x splits a sparse MoE block into a router (``gate``: logits, then top-k weights and
indices) and an experts module (``experts``: fused 3-D ``gate_up_proj``/``down_proj``, called as
``experts(hidden, top_k_index, top_k_weights)``); the block's own forward (jitter, reshapes, DeepSeek's
shared experts) is left as it is. Two instance-scoped changes per block:

- the **router** changes class (``obj.__class__``) to a subclass of its own class whose forward returns the
  same ``(router_logits, weights, indices)`` from ``ops.moe_router``. The object, its Parameters and any
  hooks stay, and it is still an instance of the transformers class, so ``output_router_logits`` (the
  recorder transformers hooks on router classes) and the load-balancing loss keep working;
- the **experts** module is swapped for :class:`wavefront.nn.MoEExperts` holding the same Parameters
  (state_dict keys unchanged), which also counts tokens per expert for the training KPIs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wavefront import ops
from wavefront.nn.moe import MoEExperts, group_limited_bias
from wavefront.patching.patcher import Patcher

#: Activations the grouped expert GEMM fuses (``grouped_linear(activation="swiglu")``).
ACTIVATIONS = ("silu", "swish")

_SUBCLASSES: dict[tuple[type, object], type] = {}  # (router class, its MoERule) -> patched subclass


def _router_forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rule = self._wavefront_rule  # the family's MoERule (rule_types.py)
    x = hidden_states.reshape(-1, self.weight.shape[1])
    logits = F.linear(x.float(), self.weight.float()) if rule.fp32_logits else F.linear(x, self.weight)
    bias = getattr(self, rule.bias_attr) if rule.bias_attr else None
    if rule.group_attrs is not None:
        n_group, topk_group = (getattr(self, a) for a in rule.group_attrs)
        if n_group and topk_group and topk_group < n_group:
            scores = torch.sigmoid(logits) if rule.score == "sigmoid" else torch.softmax(logits.float(), -1)
            bias = group_limited_bias(scores, bias, n_group, topk_group)
    normalize = bool(getattr(self, rule.normalize_attr)) if rule.normalize_attr else True
    weights, indices, _, _ = ops.moe_router(logits, self.top_k, score=rule.score, normalize=normalize, bias=bias)
    if rule.scaling_attr:
        weights = weights * getattr(self, rule.scaling_attr)
    if rule.weights_dtype == "logits":
        weights = weights.to(logits.dtype)
    return logits, weights, indices


def _restore(base: type, rule) -> nn.Module:
    """Unpickling and deep-copying entry point: an empty instance of the patched subclass of `base`."""
    cls = _router_subclass(base, rule)
    return cls.__new__(cls)


def _reduce_ex(self, protocol):
    # The subclass is built at run time, so pickle cannot find it by name: rebuild it from its base class.
    return _restore, (self._wavefront_base, self._wavefront_rule), self.__getstate__()


def _router_subclass(cls: type, rule) -> type:
    key = (cls, rule)
    if key not in _SUBCLASSES:
        _SUBCLASSES[key] = type(f"Wavefront{cls.__name__}", (cls,), {
            "forward": _router_forward, "__module__": __name__, "__reduce_ex__": _reduce_ex,
            "_wavefront_base": cls, "_wavefront_rule": rule,
            "__doc__": f"{cls.__name__} whose forward routes with wavefront.ops.moe_router"})
    return _SUBCLASSES[key]


def _router_problem(router: nn.Module, rule) -> str | None:
    weight = getattr(router, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 2:
        return "expected a 2-D 'weight' Parameter (the transformers class changed shape?)"
    if not isinstance(getattr(router, "top_k", None), int):
        return "expected an int 'top_k' attribute (the transformers class changed shape?)"
    attrs = [a for a in (rule.normalize_attr, rule.bias_attr, rule.scaling_attr, *(rule.group_attrs or ())) if a]
    missing = [a for a in attrs if not hasattr(router, a)]
    if missing:
        return f"expected attribute(s) {', '.join(missing)} (the transformers class changed shape?)"
    if rule.group_attrs is not None:
        n_group, topk_group = (getattr(router, a) for a in rule.group_attrs)
        if n_group and topk_group and topk_group < n_group and weight.shape[0] % n_group:
            return f"group-limited routing needs n_group ({n_group}) to divide the {weight.shape[0]} experts"
    return None


def _experts_problem(experts: nn.Module) -> str | None:
    for name in ("gate_up_proj", "down_proj"):
        param = getattr(experts, name, None)
        if not isinstance(param, nn.Parameter) or param.dim() != 3:
            return f"expected a 3-D '{name}' Parameter (the transformers class changed shape?)"
    if getattr(experts, "has_bias", False) or getattr(experts, "is_transposed", False):
        return "experts with biases or transposed weights have no grouped-linear path here"
    if not getattr(experts, "has_gate", True) or getattr(experts, "has_post_expert_norm", False):
        return "only gated experts without a post-expert norm are supported"
    if experts.gate_up_proj.shape[1] != 2 * experts.down_proj.shape[2]:
        return "gate_up_proj is not [gate; up] of down_proj's intermediate width"
    return None


def apply_moe(p: Patcher) -> None:
    rule = p.family.moe
    if rule is None:
        p.absent("moe", f"{p.family.name} models have no mixture-of-experts blocks")
        return
    missing = [name for name in ("moe_router", "moe_permute", "moe_unpermute", "grouped_linear")
               if not hasattr(ops, name)]
    if missing:
        p.unmatched("moe", f"wavefront.ops.{', '.join(missing)} not available in this build of wavefront")
        return
    act = next((str(v) for a in rule.activation_from if (v := getattr(p.model.config, a, None))), None)
    if act not in ACTIVATIONS:
        p.unmatched("moe", f"expert activation {act!r} has no fused grouped kernel; fused: {', '.join(ACTIVATIONS)}")
        return
    routers = p.of_classes(rule.router_classes)
    experts = p.of_classes(rule.experts_classes)
    if not routers or not experts:
        p.unmatched("moe", f"no module of class {' or '.join(rule.router_classes + rule.experts_classes)} in "
                           f"this model")
        return
    if len(routers) != len(experts):
        p.unmatched("moe", f"{len(routers)} routers but {len(experts)} experts modules: not one of each per block")
        return
    for path, router in routers:
        problem = _router_problem(router, rule)
        if problem:
            p.unmatched("moe", problem, path)
            continue
        p.swap_class("moe", path, router, _router_subclass(type(router), rule))
    for path, old in experts:
        problem = _experts_problem(old)
        if problem:
            p.unmatched("moe", problem, path)
            continue
        p.swap_module("moe", path, MoEExperts.from_parameters(old.gate_up_proj, old.down_proj))
