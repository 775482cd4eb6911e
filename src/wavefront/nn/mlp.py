"""Gated MLPs (Llama's SwiGLU, Gemma's GeGLU) on the fused activation ops.

State dict keys are Hugging Face's LlamaMLP / GemmaMLP keys (``gate_proj``, ``up_proj``, ``down_proj``, each
an ``nn.Linear``), so a checkpoint loads into either, and the forward rounds like theirs:
``down_proj(round(act(gate_proj(x))) * up_proj(x))``.

``gate_multiplier`` / ``output_multiplier`` (muP; Falcon-H1's ``mlp_multipliers = (gate, down)``) scale the gate
projection's output before the activation and the MLP's output; both are fused into the activation kernel
(``down_proj(y) * m == down_proj(y * m)``). They are Python floats, not parameters or buffers, so state dict keys
do not change.
"""

from __future__ import annotations

from torch import Tensor, nn

from wavefront import ops


class _GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None, *,
                 gate_multiplier: float = 1.0, output_multiplier: float = 1.0):
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.gate_multiplier, self.output_multiplier = float(gate_multiplier), float(output_multiplier)
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, **kw)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, **kw)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, **kw)

    def _multipliers(self) -> dict:
        return {"gate_multiplier": self.gate_multiplier, "output_multiplier": self.output_multiplier}

    def extra_repr(self) -> str:
        mults = ("" if self._multipliers() == {"gate_multiplier": 1.0, "output_multiplier": 1.0} else
                 f", gate_multiplier={self.gate_multiplier}, output_multiplier={self.output_multiplier}")
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}{mults}"


class SwiGLUMLP(_GatedMLP):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Llama, Mistral, Qwen)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x), **self._multipliers()))


class GeGLUMLP(_GatedMLP):
    """``down_proj(gelu(gate_proj(x), approximate) * up_proj(x))`` (Gemma: approximate="tanh")."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, approximate: str = "tanh",
                 device=None, dtype=None, *, gate_multiplier: float = 1.0, output_multiplier: float = 1.0):
        if approximate not in ("tanh", "none"):
            raise ValueError(f"GeGLUMLP: argument 'approximate' must be one of ['none', 'tanh'], got {approximate!r}")
        super().__init__(hidden_size, intermediate_size, bias, device, dtype, gate_multiplier=gate_multiplier,
                         output_multiplier=output_multiplier)
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(ops.geglu(self.gate_proj(x), self.up_proj(x), self.approximate, **self._multipliers()))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, approximate={self.approximate!r}"
