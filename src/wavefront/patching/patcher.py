"""What an op applier works with, and how each change is recorded so that it can be undone.

Appliers (norm.py, mlp.py, rope.py, loss.py, attention.py) import this module only; apply.py imports
the op table (table.py), which imports the appliers. No module imports apply.py back.

Every change is recorded as *data* (a path and the original object, never a closure), held by the
model instance itself in :data:`STATE_ATTR`. So ``copy.deepcopy(model)`` copies the records with the
model (the copy's records point at the copy's modules), ``torch.save(model)`` pickles them, and
``unpatch`` of a copy or of a loaded model undoes that model's own patch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from wavefront.patching.report import Absent, PatchReport, Replacement, Unmatched, qualname
from wavefront.patching.rule_types import Family

STATE_ATTR = "_wavefront_patch"

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent_path, _, name = path.rpartition(".")
    return (model.get_submodule(parent_path) if parent_path else model), name


@dataclass
class ModuleSwap:
    """The child at `path` was replaced; `original` is the module to put back."""

    path: str
    original: nn.Module

    def undo(self, model: nn.Module) -> None:
        parent, name = _parent(model, self.path)
        current = getattr(parent, name)
        # Parameters may have been replaced while patched (load_state_dict(assign=True), .to()): carry them.
        for pname, param in current.named_parameters(recurse=False):
            if hasattr(self.original, pname):
                setattr(self.original, pname, param)
        setattr(parent, name, self.original)


@dataclass
class ClassSwap:
    """The module at `path` had its ``__class__`` set to a subclass of `original_cls`."""

    path: str
    original_cls: type

    def undo(self, model: nn.Module) -> None:
        model.get_submodule(self.path).__class__ = self.original_cls


@dataclass
class Hooks:
    """Forward (pre-)hooks registered on the model itself, by their handle ids."""

    ids: tuple[int, ...]

    def undo(self, model: nn.Module) -> None:
        for attr in _HOOK_DICTS:
            hooks = getattr(model, attr, None)
            if hooks is not None:
                for hook_id in self.ids:
                    hooks.pop(hook_id, None)


@dataclass
class SetAttr:
    """The module at `path` was given the attribute `name` (an FP8 hand-off link); undo deletes it."""

    path: str
    name: str

    def undo(self, model: nn.Module) -> None:
        module = model.get_submodule(self.path)
        if self.name in module.__dict__:
            delattr(module, self.name)


@dataclass
class State:
    """The patch of one model instance: its report and the changes to undo, in order."""

    report: PatchReport
    changes: list = field(default_factory=list)

    def undo(self, model: nn.Module) -> None:
        for change in reversed(self.changes):
            change.undo(model)


@dataclass
class Patcher:
    """What an op applier gets: the model, its family's rules, the report, and recording helpers."""

    model: nn.Module
    family: Family | None
    report: PatchReport
    changes: list = field(default_factory=list)
    replaced: set[int] = field(default_factory=set)  # id() of modules already taken by a rule

    def modules(self) -> list[tuple[str, nn.Module]]:
        return list(self.model.named_modules())

    def of_classes(self, names: tuple[str, ...]) -> list[tuple[str, nn.Module]]:
        """Modules of the model whose class (exactly, by name, from transformers) is one of `names`; a module
        whose class another op already swapped (RoPE) counts as its original class."""
        found = []
        for path, m in self.modules():
            cls = getattr(type(m), "_wavefront_base", type(m))
            if cls.__name__ in names and cls.__module__.startswith("transformers."):
                found.append((path, m))
        return found

    def swap_module(self, op: str, path: str, new: nn.Module) -> None:
        """Replace the child at `path` with `new`; `new` must already hold the old module's parameters."""
        parent, name = _parent(self.model, path)
        old = getattr(parent, name)
        new.train(old.training)
        setattr(parent, name, new)
        self.replaced.add(id(old))
        self.changes.append(ModuleSwap(path, old))
        self.report.replacements.append(Replacement(op, path, qualname(type(old)), qualname(type(new)), "module swap"))

    def swap_class(self, op: str, path: str, obj: nn.Module, new_cls: type) -> None:
        old_cls = type(obj)
        obj.__class__ = new_cls
        self.replaced.add(id(obj))
        self.changes.append(ClassSwap(path, old_cls))
        self.report.replacements.append(Replacement(op, path, qualname(old_cls), qualname(new_cls), "class swap"))

    def set_attr(self, path: str, name: str, value) -> None:
        """Give the module at `path` a plain attribute, recorded (undo deletes it)."""
        object.__setattr__(self.model.get_submodule(path), name, value)
        self.changes.append(SetAttr(path, name))

    def record(self, change) -> None:
        """Record a change made by the applier itself (an object with ``undo(model)``)."""
        self.changes.append(change)

    def unmatched(self, op: str, reason: str, path: str | None = None) -> None:
        self.report.unmatched.append(Unmatched(op, reason, path))

    def absent(self, op: str, reason: str) -> None:
        self.report.absent.append(Absent(op, reason))

    def undo(self) -> None:
        State(self.report, self.changes).undo(self.model)
