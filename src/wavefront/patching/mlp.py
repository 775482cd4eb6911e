"""The gated-MLP applier: ``down(act(gate(x)) * up(x))`` becomes ``down(swiglu(gate(x), up(x)))`` (or
GeGLU), one fused pass instead of three elementwise kernels and two stored intermediates.

The replacement modules hold the original Linear children under their original names, so state_dict
keys (``gate_proj``/``up_proj``/``down_proj``, or Phi-3's ``gate_up_proj``/``down_proj``) do not change.
A rule with ``multipliers_from`` (Falcon-H1's ``mlp_multipliers``) passes the muP gate and output multipliers
to the fused activation: ``down(act(round(gate * m_g)) * up * m_o)``, equal to Hugging Face's
``down(up * act(gate * m_g)) * m_o`` up to where the output multiplier's rounding falls.
In an FP8 model (``patch(fp8=...)``) the MLP may carry an ``fp8_handoff`` (wavefront.nn.fp8.Fp8HandOff):
the activation then also emits the down projection's FP8 input from its own kernel pass.
"""

from __future__ import annotations

import torch
from torch import nn

from wavefront import ops
from wavefront.patching.patcher import Patcher

#: Hugging Face activation names (transformers.activations.ACT2FN keys) -> (wavefront op, its options).
#: "gelu" is the exact erf GELU; "gelu_pytorch_tanh" and "gelu_new" are the tanh approximation.
ACTIVATIONS: dict[str, tuple[str, dict]] = {
    "silu": ("swiglu", {}),
    "swish": ("swiglu", {}),
    "gelu_pytorch_tanh": ("geglu", {"approximate": "tanh"}),
    "gelu_new": ("geglu", {"approximate": "tanh"}),
    "gelu": ("geglu", {"approximate": "none"}),
}


def _gated(module: nn.Module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    fn = getattr(ops, module.kernel)
    handoff = getattr(module, "fp8_handoff", None)
    if handoff is not None and handoff.active(gate):
        h, q, scale = fn(gate, up, **module.options, **handoff.options(gate.device))
        handoff.put(h, q, scale)
        return h
    return fn(gate, up, **module.options)


class GatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` with the activation and product fused."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module, kernel: str, options: dict):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.kernel, self.options = kernel, dict(options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(_gated(self, self.gate_proj(x), self.up_proj(x)))

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, options={self.options}"


class FusedGateUpMLP(nn.Module):
    """Phi-3's MLP: ``gate_up_proj`` yields [gate, up] along the last dim."""

    def __init__(self, gate_up_proj: nn.Module, down_proj: nn.Module, kernel: str, options: dict):
        super().__init__()
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj
        self.kernel, self.options = kernel, dict(options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(_gated(self, gate, up))

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, options={self.options}"


def _activation_name(config, attrs: tuple[str, ...]) -> str | None:
    for attr in attrs:
        value = getattr(config, attr, None)
        if value:
            return str(value)
    return None


def apply_mlp(p: Patcher) -> None:
    rule = p.family.mlp
    if rule is None:
        p.absent("mlp", f"{p.family.name} models have no gated MLP")
        return
    # A vision-language model keeps the text tower's settings in its text config (the config itself elsewhere).
    config = p.model.config.get_text_config()
    act = _activation_name(config, rule.activation_from)
    if act not in ACTIVATIONS:
        p.unmatched("mlp", f"activation {act!r} (config.{'/'.join(rule.activation_from)}) has no fused gated "
                           f"kernel; fused: {', '.join(sorted(ACTIVATIONS))}")
        return
    kernel, options = ACTIVATIONS[act]
    if rule.multipliers_from is not None:
        mults = getattr(config, rule.multipliers_from, None)
        if (not isinstance(mults, list | tuple) or len(mults) != 2
                or not all(isinstance(m, int | float) and not isinstance(m, bool) for m in mults)):
            p.unmatched("mlp", f"expected config.{rule.multipliers_from} to be (gate multiplier, output multiplier), "
                               f"got {mults!r}")
            return
        options = {**options, "gate_multiplier": float(mults[0]), "output_multiplier": float(mults[1])}
    if not hasattr(ops, kernel):
        p.unmatched("mlp", f"wavefront.ops.{kernel} is not available in this build of wavefront")
        return
    found = p.of_classes(rule.classes)
    if not found and rule.optional:
        p.absent("mlp", f"no dense MLP ({' or '.join(rule.classes)}) in this model: every layer is sparse")
        return
    if not found:
        p.unmatched("mlp", f"no module of class {' or '.join(rule.classes)} in this model")
        return
    names = ("gate_up_proj", "down_proj") if rule.fused_gate_up else ("gate_proj", "up_proj", "down_proj")
    for path, old in found:
        children = [getattr(old, n, None) for n in names]
        if not all(isinstance(c, nn.Module) for c in children):
            p.unmatched("mlp", f"expected children {', '.join(names)} (the transformers class changed shape?)", path)
            continue
        cls = FusedGateUpMLP if rule.fused_gate_up else GatedMLP
        p.swap_module("mlp", path, cls(*children, kernel, options))
