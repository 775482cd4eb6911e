"""apply() and revert(): run the op table's appliers over one model instance, record how to undo them.

Four instance-scoped mechanisms, nothing global replaced:

- **module swap**: ``setattr(parent, name, new)`` where ``new`` reuses the old module's parameters (and
  children), so ``state_dict()`` keys and tensors are unchanged (norms, MLPs, the LM head);
- **class swap**: ``obj.__class__ = Sub`` where ``Sub`` subclasses the module's own class and only
  overrides ``forward`` (attention modules, for RoPE): the object, its parameters and attributes stay;
- **hooks**: forward (pre-)hooks registered on the model instance (the fused loss);
- **attention implementation**: transformers' ``AttentionInterface`` gains a "wavefront" entry and the
  patched model's own config selects it (``set_attn_implementation``); other models keep theirs.

Every change is recorded as data on the model (patcher.py); :func:`revert` undoes them in reverse. A
failed strict patch is reverted before :class:`PatchError` is raised, so a model is never half patched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import metadata

from torch import nn

from wavefront.patching.fp8 import apply_fp8, resolve
from wavefront.patching.patcher import STATE_ATTR, Patcher, State
from wavefront.patching.report import PatchError, PatchReport
from wavefront.patching.rules import family_for, supported_model_types
from wavefront.patching.table import DEFAULTS, OPS, PATCHABLE


def _transformers_version() -> str | None:
    try:
        return metadata.version("transformers")
    except Exception:
        return None


def _check(model: nn.Module, options: dict) -> dict[str, bool]:
    unknown = sorted(set(options) - set(OPS) - {"strict"})
    if unknown:
        raise TypeError(f"wavefront.patch: unknown option(s) {', '.join(repr(u) for u in unknown)}; ops: "
                        f"{', '.join(OPS)} (and strict)")
    flags = {**DEFAULTS, "strict": True, **options}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"wavefront.patch: option '{name}' must be True or False, got {value!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"wavefront.patch: 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, STATE_ATTR, None) is not None:
        raise ValueError("wavefront.patch: this model is already patched; call wavefront.unpatch(model) first")
    if not isinstance(getattr(getattr(model, "config", None), "model_type", None), str):
        raise TypeError("wavefront.patch: 'model' must be a Hugging Face transformers model (it has no "
                        "config.model_type)")
    return flags


def apply(model: nn.Module, *, fp8=None, **options: bool) -> PatchReport:
    """Patch one Hugging Face causal-LM instance in place; see :func:`wavefront.patch`."""
    fp8_cfg = resolve(fp8)
    flags = _check(model, options)
    model_type = model.config.model_type
    family = family_for(model_type)
    requested = tuple(op for op in OPS if flags[op]) + (("fp8",) if fp8_cfg else ())
    report = PatchReport(model_type, family.name if family else None, requested, _transformers_version(),
                         fp8=fp8_cfg.recipe if fp8_cfg else None)
    p = Patcher(model, family, report)
    try:
        for row in PATCHABLE:
            if not flags[row.name]:
                continue
            if family is None and not row.any_family:
                p.unmatched(row.name, f"wavefront has no rules for model_type {model_type!r}; supported: "
                                      f"{', '.join(supported_model_types())} (see docs/patching.md to add a family)")
                continue
            why = family.why_unsupported(row.name) if family is not None else None
            if why is not None:
                p.unmatched(row.name, f"{why}; patch with {row.name}=False")
                continue
            row.apply(p)
        if fp8_cfg is not None:  # after the MLP swap: the fused MLPs hold the original Linear children
            apply_fp8(p, fp8_cfg)
    except BaseException:
        p.undo()
        raise
    if flags["strict"] and report.unmatched:
        p.undo()
        raise PatchError(report)
    object.__setattr__(model, STATE_ATTR, State(report, p.changes))
    return report


def revert(model: nn.Module) -> PatchReport:
    """Restore the exact original modules, classes, hooks and attention implementation of a patched
    model; returns the report of the patch that was undone. Raises ValueError on a model not patched."""
    state: State | None = getattr(model, STATE_ATTR, None)
    if not isinstance(state, State):
        raise ValueError("wavefront.unpatch: this model is not patched by wavefront")
    state.undo(model)
    object.__delattr__(model, STATE_ATTR)
    return state.report


def is_patched(model: nn.Module) -> bool:
    return isinstance(getattr(model, STATE_ATTR, None), State)


def patch_report(model: nn.Module) -> PatchReport | None:
    """The report of the patch currently applied to `model`, or None."""
    state = getattr(model, STATE_ATTR, None)
    return state.report if isinstance(state, State) else None


@contextlib.contextmanager
def patched(model: nn.Module, *, fp8=None, **options: bool) -> Iterator[PatchReport]:
    """``with wavefront.patching.patched(model) as report:`` patches on entry and unpatches on exit."""
    report = apply(model, fp8=fp8, **options)
    try:
        yield report
    finally:
        revert(model)
