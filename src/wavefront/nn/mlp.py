"""Gated MLPs (Llama's SwiGLU, Gemma's GeGLU) on the fused activation ops.

State dict keys are Hugging Face's LlamaMLP / GemmaMLP keys (``gate_proj``, ``up_proj``, ``down_proj``, each
an ``nn.Linear``), so a checkpoint loads into either, and the forward rounds like theirs:
``down_proj(round(act(gate_proj(x))) * up_proj(x))``.
"""

from __future__ import annotations

from torch import Tensor, nn

from wavefront import ops


class _GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, **kw)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, **kw)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, **kw)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}"


class SwiGLUMLP(_GatedMLP):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Llama, Mistral, Qwen)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x)))


class GeGLUMLP(_GatedMLP):
    """``down_proj(gelu(gate_proj(x), approximate) * up_proj(x))`` (Gemma: approximate="tanh")."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, approximate: str = "tanh",
                 device=None, dtype=None):
        if approximate not in ("tanh", "none"):
            raise ValueError(f"GeGLUMLP: argument 'approximate' must be one of ['none', 'tanh'], got {approximate!r}")
        super().__init__(hidden_size, intermediate_size, bias, device, dtype)
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(ops.geglu(self.gate_proj(x), self.up_proj(x), self.approximate))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, approximate={self.approximate!r}"
