"""apply() and revert(): run a family's rules over one model instance, record how to undo every change.

Three instance-scoped mechanisms, nothing global:

- **module swap**: ``setattr(parent, name, new)`` where ``new`` reuses the old module's parameters (and
  children), so ``state_dict()`` keys and tensors are unchanged (norms, MLPs, the LM head);
- **class swap**: ``obj.__class__ = Sub`` where ``Sub`` subclasses the module's own class and only
  overrides ``forward`` (attention modules for RoPE): the object, its parameters and its attributes stay;
- **hooks**: forward (pre-)hooks registered on the model instance (the fused loss).

Every change pushes an undo action; :func:`revert` pops them in reverse. Before undoing a module swap
the current parameters of the replacement are written back onto the original module, so a model that was
trained, moved or reloaded (``load_state_dict(assign=True)``) while patched unpatches to the same values.
A failed strict patch is reverted before :class:`PatchError` is raised, so the model is never half patched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from torch import nn

from wavefront.patching.report import OPS, Absent, PatchError, PatchReport, Replacement, Unmatched, qualname
from wavefront.patching.rule_types import Family

_STATE_ATTR = "_wavefront_patch"


@dataclass
class _State:
    report: PatchReport
    undo: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Patcher:
    """What an op applier gets: the model, its modules by path, and recording helpers."""

    model: nn.Module
    family: Family | None
    report: PatchReport
    undo: list[Callable[[], None]] = field(default_factory=list)
    replaced: set[int] = field(default_factory=set)  # id() of modules already taken by a rule

    def modules(self) -> list[tuple[str, nn.Module]]:
        return list(self.model.named_modules())

    def of_classes(self, names: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
        """Modules of the model whose class (exactly, by name, from transformers) is one of `names`."""
        return [(p, m) for p, m in self.modules()
                if type(m).__name__ in names and type(m).__module__.startswith("transformers.")]

    def swap_module(self, op: str, path: str, new: nn.Module) -> None:
        """Replace the child at `path` with `new`; `new` must already hold the old module's parameters."""
        parent_path, _, name = path.rpartition(".")
        parent = self.model.get_submodule(parent_path) if parent_path else self.model
        old = getattr(parent, name)
        new.train(old.training)
        setattr(parent, name, new)
        self.replaced.add(id(old))

        def undo() -> None:
            for pname, param in new.named_parameters(recurse=False):
                if hasattr(old, pname):
                    setattr(old, pname, param)
            setattr(parent, name, old)

        self.undo.append(undo)
        self.report.replacements.append(Replacement(op, path, qualname(type(old)), qualname(type(new)), "module swap"))

    def swap_class(self, ops: tuple[str, ...], path: str, obj: nn.Module, new_cls: type) -> None:
        old_cls = type(obj)
        obj.__class__ = new_cls
        self.replaced.add(id(obj))

        def undo() -> None:
            obj.__class__ = old_cls

        self.undo.append(undo)
        for op in ops:
            self.report.replacements.append(Replacement(op, path, qualname(old_cls), qualname(new_cls), "class swap"))

    def add_undo(self, fn: Callable[[], None]) -> None:
        self.undo.append(fn)

    def unmatched(self, op: str, reason: str, path: str | None = None) -> None:
        self.report.unmatched.append(Unmatched(op, reason, path))

    def absent(self, op: str, reason: str) -> None:
        self.report.absent.append(Absent(op, reason))


def _transformers_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return None


def _run_undo(undo: list[Callable[[], None]]) -> None:
    for fn in reversed(undo):
        fn()


def apply(model: nn.Module, *, rms_norm: bool = True, layer_norm: bool = True, rope: bool = True, mlp: bool = True,
          loss: bool = True, attention: bool = False, strict: bool = True) -> PatchReport:
    """Patch one Hugging Face causal-LM instance in place; see :func:`wavefront.patch`."""
    from wavefront.patching import attention as attention_op
    from wavefront.patching import loss as loss_op
    from wavefront.patching import mlp as mlp_op
    from wavefront.patching import norm as norm_op
    from wavefront.patching import rope as rope_op
    from wavefront.patching.rules import family_for, supported_model_types

    flags = {"rms_norm": rms_norm, "layer_norm": layer_norm, "rope": rope, "mlp": mlp, "loss": loss,
             "attention": attention, "strict": strict}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"wavefront.patch: option '{name}' must be True or False, got {value!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"wavefront.patch: 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, _STATE_ATTR, None) is not None:
        raise ValueError("wavefront.patch: this model is already patched; call wavefront.unpatch(model) first")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str):
        raise TypeError("wavefront.patch: 'model' must be a Hugging Face transformers model (it has no "
                        "config.model_type)")

    family = family_for(model_type)
    requested = tuple(op for op in OPS if flags[op])
    report = PatchReport(model_type, family.name if family else None, requested, _transformers_version())
    p = Patcher(model, family, report)
    if family is None:
        for op in requested:
            if op != "layer_norm":
                p.unmatched(op, f"wavefront has no rules for model_type {model_type!r}; supported: "
                                f"{', '.join(supported_model_types())} (see docs/patching.md to add a family)")

    appliers = {"rms_norm": norm_op.apply_rms_norm, "layer_norm": norm_op.apply_layer_norm,
                "mlp": mlp_op.apply_mlp, "loss": loss_op.apply_loss}
    try:
        for op in ("rms_norm", "layer_norm", "mlp", "loss"):
            if flags[op] and (family is not None or op == "layer_norm"):
                appliers[op](p)
        if family is not None and (rope or attention):
            overrides = rope_op.collect(p) if rope else {}
            if attention:
                attention_op.collect(p, overrides)
            rope_op.swap_attention_classes(p, overrides)
        if rms_norm or layer_norm:
            norm_op.report_unknown_norms(p, rms_norm=rms_norm, layer_norm=layer_norm)
    except BaseException:
        _run_undo(p.undo)
        raise
    if strict and report.unmatched:
        _run_undo(p.undo)
        raise PatchError(report)
    object.__setattr__(model, _STATE_ATTR, _State(report, p.undo))
    return report


def revert(model: nn.Module) -> PatchReport:
    """Restore the exact original modules, classes and hooks of a patched model; returns the report of
    the patch that was undone. Raises ValueError on a model that is not patched."""
    state: _State | None = getattr(model, _STATE_ATTR, None)
    if state is None:
        raise ValueError("wavefront.unpatch: this model is not patched by wavefront")
    _run_undo(state.undo)
    object.__delattr__(model, _STATE_ATTR)
    return state.report


def is_patched(model: nn.Module) -> bool:
    return getattr(model, _STATE_ATTR, None) is not None


def patch_report(model: nn.Module) -> PatchReport | None:
    """The report of the patch currently applied to `model`, or None."""
    state = getattr(model, _STATE_ATTR, None)
    return state.report if state is not None else None


@contextlib.contextmanager
def patched(model: nn.Module, **options) -> Iterator[PatchReport]:
    """``with wavefront.patching.patched(model) as report:`` patches on entry and unpatches on exit."""
    report = apply(model, **options)
    try:
        yield report
    finally:
        revert(model)
