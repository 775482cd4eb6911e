"""The patchable ops: one row each. ``wavefront.patch(model, <name>=True/False)`` takes exactly these names.

Adding a patchable op (docs/patching.md walks through it) touches at most four files plus the families'
rules: its applier module (``def apply_<op>(p: Patcher) -> None``), a row here, its rule dataclass and
``Family`` field in rule_types.py, and docs/patching.md. apply.py, the report, the CLI's ``--patch-ops``
and the tests' option lists all read this table.

Rows run in table order. Ops that change the same module must not both claim it: RoPE swaps the class of
attention modules, attention only changes the model's ``attn_implementation``, so they compose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from wavefront.patching.attention import apply_attention
from wavefront.patching.loss import apply_loss
from wavefront.patching.mlp import apply_mlp
from wavefront.patching.moe import apply_moe
from wavefront.patching.norm import apply_layer_norm, apply_rms_norm
from wavefront.patching.patcher import Patcher
from wavefront.patching.rope import apply_rope


@dataclass(frozen=True)
class PatchableOp:
    name: str  # keyword of wavefront.patch
    apply: Callable[[Patcher], None]
    default: bool  # on unless the caller turns it off
    any_family: bool = False  # applies to models without family rules too (LayerNorm is matched by type)
    summary: str = ""


PATCHABLE: tuple[PatchableOp, ...] = (
    PatchableOp("rms_norm", apply_rms_norm, True, summary="family RMSNorm classes -> wavefront.nn.RMSNorm"),
    PatchableOp("layer_norm", apply_layer_norm, True, any_family=True,
                summary="torch.nn.LayerNorm -> wavefront.nn.LayerNorm"),
    PatchableOp("rope", apply_rope, True, summary="attention modules rotate q and k with ops.rope"),
    PatchableOp("mlp", apply_mlp, True, summary="gated MLPs -> fused SwiGLU/GeGLU"),
    PatchableOp("moe", apply_moe, True, summary="MoE routers -> ops.moe_router; experts -> permute, grouped GEMMs, "
                                                "weighted combine"),
    PatchableOp("loss", apply_loss, True, summary="causal-LM loss -> ops.linear_cross_entropy in training"),
    PatchableOp("attention", apply_attention, False,
                summary="attention function -> ops.attention through transformers' AttentionInterface"),
)

#: The op names, in table order (the keywords of :func:`wavefront.patch`).
OPS: tuple[str, ...] = tuple(row.name for row in PATCHABLE)
DEFAULTS: dict[str, bool] = {row.name: row.default for row in PATCHABLE}
