"""Hugging Face integration: swap wavefront kernels into one model instance, reported and reversible.

    report = wavefront.patch(model)          # PatchReport: every replacement, every unmatched op
    print(report)
    wavefront.unpatch(model)                 # the exact original modules again

    with wavefront.patching.patched(model, loss=False) as report:
        ...

Rules per family live in :mod:`wavefront.patching.rules`, the patchable ops in
:mod:`wavefront.patching.table`; docs/patching.md explains the mechanisms (module swap, instance class
swap, hooks, the instance's attention implementation) and how to add a family or an op.
"""

from __future__ import annotations

from torch import nn

from wavefront.patching.apply import apply as _apply
from wavefront.patching.apply import is_patched, patch_report, patched, revert
from wavefront.patching.fp8 import Fp8Config
from wavefront.patching.loss import loss_metrics
from wavefront.patching.report import Absent, HandOff, PatchError, PatchReport, Replacement, Unmatched
from wavefront.patching.table import OPS, PATCHABLE


def patch(model: nn.Module, *, strict: bool = True, fp8: str | Fp8Config | None = None, **ops: bool) -> PatchReport:
    """Swap wavefront kernels into one Hugging Face causal-LM instance, in place.

    Each keyword of :data:`OPS` requests one op (defaults in :data:`PATCHABLE`): ``rms_norm``,
    ``layer_norm`` (torch.nn.LayerNorm modules), ``rope``, ``mlp`` (SwiGLU/GeGLU), ``loss`` (fused LM-head
    cross-entropy in training) on by default; ``attention`` opt-in. Parameters are reused, so
    ``state_dict()`` keys and tensors are unchanged and a checkpoint of the patched model loads into an
    unpatched one and back.

    strict=True (default) raises :class:`PatchError`, leaving the model unpatched, when a requested op
    could not be applied where the model's family has it (an unknown norm type, a missing kernel, an
    unsupported transformers version). Ops the family does not have (LayerNorm in Llama) are reported
    as absent and never raise. Unknown options and non-boolean values raise TypeError.

    fp8: None (default), a recipe ("tensorwise", "rowwise", "blockwise", "mxfp8") or an :class:`Fp8Config`:
    the model's ``torch.nn.Linear`` layers become :class:`wavefront.nn.Float8Linear` except those the
    recipe keeps in high precision (the LM head by default; see :mod:`wavefront.patching.fp8`).
    """
    return _apply(model, strict=strict, fp8=fp8, **ops)


def unpatch(model: nn.Module) -> PatchReport:
    """Undo :func:`patch`: the original module objects, classes, hooks and attention implementation."""
    return revert(model)


__all__ = ["OPS", "PATCHABLE", "Absent", "Fp8Config", "HandOff", "PatchError", "PatchReport", "Replacement",
           "Unmatched", "is_patched", "loss_metrics", "patch", "patch_report", "patched", "unpatch"]
