"""Hugging Face integration: swap wavefront kernels into one model instance, reported and reversible.

    report = wavefront.patch(model)          # PatchReport: every replacement, every unmatched op
    print(report)
    wavefront.unpatch(model)                 # the exact original modules again

    with wavefront.patching.patched(model, loss=False) as report:
        ...

Rules per family live in :mod:`wavefront.patching.rules`; docs/patching.md explains the mechanisms
(module swap, instance class swap, hooks) and how to add a family.
"""

from __future__ import annotations

from torch import nn

from wavefront.patching.apply import apply as _apply
from wavefront.patching.apply import is_patched, patch_report, patched, revert
from wavefront.patching.report import OPS, Absent, PatchError, PatchReport, Replacement, Unmatched


def patch(model: nn.Module, *, rms_norm: bool = True, layer_norm: bool = True, rope: bool = True, mlp: bool = True,
          loss: bool = True, attention: bool = False, strict: bool = True) -> PatchReport:
    """Swap wavefront kernels into one Hugging Face causal-LM instance, in place.

    Each option requests one op: ``rms_norm``, ``layer_norm`` (torch.nn.LayerNorm modules), ``rope``,
    ``mlp`` (SwiGLU/GeGLU), ``loss`` (fused LM-head cross-entropy in training), ``attention`` (opt-in).
    Parameters are reused, so ``state_dict()`` keys and tensors are unchanged and a checkpoint of the
    patched model loads into an unpatched one and back.

    strict=True (default) raises :class:`PatchError`, leaving the model unpatched, when a requested op
    could not be applied where the model's family has it (an unknown norm type, a missing kernel, an
    unsupported transformers version). Ops the family does not have (LayerNorm in Llama) are reported
    as absent and never raise. Unknown options raise TypeError.
    """
    return _apply(model, rms_norm=rms_norm, layer_norm=layer_norm, rope=rope, mlp=mlp, loss=loss,
                  attention=attention, strict=strict)


def unpatch(model: nn.Module) -> PatchReport:
    """Undo :func:`patch`: the original module objects, classes and hooks are restored."""
    return revert(model)


__all__ = ["OPS", "Absent", "PatchError", "PatchReport", "Replacement", "Unmatched", "is_patched", "patch",
           "patch_report", "patched", "unpatch"]
