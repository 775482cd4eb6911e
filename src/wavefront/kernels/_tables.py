"""Per-family launch tables: one default row, and a family's own row only where a measurement differs.

A launcher's thresholds (block caps, vectors per lane, warps) are data, one row per architecture family
(``nvidia``, ``amd-cdna``, ``amd-rdna``, and ``cpu`` for the interpreter). Most families share most values,
and a table that spells every row out repeats the same row four times, so nobody can see which value was
measured where. A :class:`FamilyTable` is written as the default row, the reason it holds, and a
:class:`Differs` for each family whose measurement differs, naming only the fields that change and the
measurement that changed them::

    QUANTIZE_TABLES = FamilyTable(
        QuantizeTable(tile_elems=8192, max_row_block=8192, max_warps=8),
        "8192 fp32 values per program: 32 values per lane at 8 warps of 32 lanes, no spill",
        {"amd-cdna": Differs("wave64: 4 waves hold the 8192 values at 32 per lane", max_warps=4)},
    )

It reads as the plain ``dict[family, row]`` the launchers always indexed (every family resolved, so
``table[arch.family]``, iteration and ``monkeypatch.setitem`` work unchanged), and it keeps the reasons:
:meth:`FamilyTable.reason` is the measurement behind a family's row, :meth:`FamilyTable.differs` lists the
families that have their own. A :class:`Differs` that changes nothing, names an unknown family or gives no
reason is an error when the module is imported.

Rows whose values are not dataclasses (a tuple of candidates, a dict per kernel) give the family's whole
row: ``Differs(reason, row=...)``. A dataclass row with a ``reason`` field (a tile entry, which reports why it
was chosen) gets the Differs' reason written on it, and a row that differs from the default in its reason
alone is refused like an equal one. That is how the matrix-unit tables adopt the type: attention's
``family -> kernel -> head dim -> candidates`` becomes one ``FamilyTable`` per kernel whose rows are the
``head dim -> candidates`` dicts, the default the family shared by most targets and a ``Differs(reason,
row=...)`` for each other (the per-arch rows ``sm_90`` and ``sm_100`` are keys too: pass
``families=(...)`` with them), and each candidate keeps its own compile-measured reason.

:class:`SingleStage` is the launch options of every kernel without a software pipeline (row-wise and
elementwise kernels): ``num_warps`` from the config, ``num_stages`` 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass, replace
from typing import Any, Generic, TypeVar

from wavefront.runtime import ARCHS

T = TypeVar("T")

#: Every architecture family a launcher may be asked for, in the order of runtime.ARCHS.
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(a.family for a in ARCHS.values()))


class Differs:
    """A family's own row: the fields that differ from the default (``changes``), or the whole row (``row``),
    and the measurement that says why (``reason``)."""

    __slots__ = ("reason", "row", "changes")

    def __init__(self, reason: str, row: Any = None, **changes: Any) -> None:
        if not reason.strip():
            raise ValueError("Differs: reason must say which measurement differs, got an empty string")
        if (row is None) == (not changes):
            raise ValueError("Differs: give either the changed fields or the whole row (row=...), not both or neither")
        self.reason = reason
        self.row = row
        self.changes = changes

    def resolve(self, default: Any) -> Any:
        if self.row is not None:
            row = self.row
        elif not is_dataclass(default) or isinstance(default, type):
            raise TypeError(f"Differs: field changes need a dataclass default row, got {type(default).__name__}; "
                            "give the whole row with row=...")
        else:
            row = replace(default, **self.changes)
        # A row that carries its own reason (a tile entry) carries this one: the measurement written on the row.
        if _has_reason(row) and "reason" not in self.changes:
            row = replace(row, reason=self.reason)
        return row


def _has_reason(row: Any) -> bool:
    return is_dataclass(row) and not isinstance(row, type) and any(f.name == "reason" for f in fields(row))


def _measured(row: Any) -> Any:
    """The row without its reason: what a family's own row must change to exist."""
    return replace(row, reason="") if _has_reason(row) else row


class FamilyTable(dict[str, T], Generic[T]):
    """``family -> row`` for every family: the default row, overridden where a :class:`Differs` says so."""

    def __init__(self, default: T, reason: str, rows: Mapping[str, Differs] | None = None, *,
                 families: Iterable[str] = FAMILIES) -> None:
        families = tuple(families)
        rows = dict(rows or {})
        unknown = sorted(set(rows) - set(families))
        if unknown:
            raise ValueError(f"FamilyTable: unknown families {unknown}; expected some of {list(families)}")
        if not reason.strip():
            raise ValueError("FamilyTable: reason must say why the default row holds, got an empty string")
        resolved = {f: rows[f].resolve(default) if f in rows else default for f in families}
        same = sorted(f for f in rows if _measured(resolved[f]) == _measured(default))
        if same:
            raise ValueError(f"FamilyTable: the rows of {same} equal the default; drop them (a row exists only "
                             "where a measurement differs)")
        super().__init__(resolved)
        self.default = default
        self.default_reason = reason
        self._reasons = {f: d.reason for f, d in rows.items()}

    def reason(self, family: str) -> str:
        """The measurement behind `family`'s row: its own where it differs, else the default's."""
        if family not in self:
            raise KeyError(family)
        return self._reasons.get(family, self.default_reason)

    def differs(self) -> dict[str, str]:
        """The families with their own row, each with its reason."""
        return dict(self._reasons)


class SingleStage:
    """Launch options of a config whose kernel has no software pipeline: its ``num_warps``, one stage.
    A frozen dataclass config with a ``num_warps`` field mixes this in."""

    num_warps: int

    def options(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": 1}
