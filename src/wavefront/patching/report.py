"""What a patch did: every replacement, every requested op that matched nothing, and why.

Three kinds of entries, so that a reader never has to guess whether something was silently skipped:

- :class:`Replacement`: one module of the model now runs a wavefront kernel (path, old type -> new type,
  and how: a child-module swap, an instance class swap, hooks on the model instance, or the instance's
  attention implementation);
- :class:`Unmatched`: a requested op that could not be applied somewhere it should have been (an unknown
  norm type, an activation without a fused kernel, a kernel not in this build, a transformers version
  whose code no longer has the expected shape). ``strict=True`` raises on any of these;
- :class:`Absent`: a requested op the model's family simply does not have (Llama has no LayerNorm).
  Informational; never raises.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Replacement:
    op: str
    path: str  # module path inside the model ("" is the model itself)
    old_type: str  # qualified class name before
    new_type: str  # qualified class name after
    how: str  # "module swap" | "class swap" | "hooks" | "attn_implementation"


@dataclass(frozen=True)
class Unmatched:
    op: str
    reason: str
    path: str | None = None  # the module that could not be patched; None when nothing was found at all


@dataclass(frozen=True)
class Absent:
    op: str
    reason: str


@dataclass(frozen=True)
class HandOff:
    """An FP8 patch's fused producer: `producer` quantizes its output for `consumers` in its own kernel pass."""

    producer: str  # module path
    consumers: tuple[str, ...]  # Float8Linear paths
    scaling: str  # the activation scaling the copy carries


@dataclass
class PatchReport:
    model_type: str
    family: str | None  # the rules file that applied; None for a model type without rules
    requested: tuple[str, ...]
    transformers_version: str | None
    replacements: list[Replacement] = field(default_factory=list)
    unmatched: list[Unmatched] = field(default_factory=list)
    absent: list[Absent] = field(default_factory=list)
    fp8: str | None = None  # the FP8 recipe of patch(fp8=...), None without FP8
    handoffs: list[HandOff] = field(default_factory=list)  # fused FP8 producers (Fp8Config.fused_producers)

    @property
    def ok(self) -> bool:
        """True when every requested op was applied wherever the family has it."""
        return not self.unmatched

    def counts(self) -> dict[str, int]:
        """Replacements per op."""
        return dict(Counter(r.op for r in self.replacements))

    def as_dict(self) -> dict:
        return {
            "model_type": self.model_type,
            "family": self.family,
            "requested": list(self.requested),
            "transformers_version": self.transformers_version,
            "ok": self.ok,
            "counts": self.counts(),
            "replacements": [asdict(r) for r in self.replacements],
            "unmatched": [asdict(u) for u in self.unmatched],
            "absent": [asdict(a) for a in self.absent],
            "fp8": self.fp8,
            "fp8_handoffs": [asdict(h) for h in self.handoffs],
        }

    def __str__(self) -> str:
        lines = [f"wavefront patch of a {self.model_type!r} model (rules: {self.family or 'none'}): "
                 f"{len(self.replacements)} replacement(s), {len(self.unmatched)} unmatched"
                 + (f", FP8 recipe {self.fp8!r}" if self.fp8 else "")]
        for r in self.replacements:
            lines.append(f"  {r.op:<10} {r.path or '<model>'}: {r.old_type} -> {r.new_type} ({r.how})")
        for h in self.handoffs:
            lines.append(f"  fp8 fused  {h.producer} -> {', '.join(h.consumers)} ({h.scaling})")
        for u in self.unmatched:
            where = f" at {u.path}" if u.path else ""
            lines.append(f"  UNMATCHED {u.op}{where}: {u.reason}")
        for a in self.absent:
            lines.append(f"  absent    {a.op}: {a.reason}")
        return "\n".join(lines)


class PatchError(RuntimeError):
    """strict=True and a requested op matched nothing (or only partly); the model was left unpatched."""

    def __init__(self, report: PatchReport):
        self.report = report
        items = "; ".join(f"{u.op}{' at ' + u.path if u.path else ''}: {u.reason}" for u in report.unmatched)
        super().__init__(f"wavefront.patch(strict=True): {len(report.unmatched)} requested op(s) could not be "
                         f"applied, model left unpatched: {items}. Pass strict=False to apply the rest, or "
                         f"turn the op off (e.g. rope=False).")


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
