"""JSON documents from other tools (``wavefront inspect --json``, ``wavefront traffic --json``, ...) as tables.

The report does not know those schemas: any list of objects found in a document becomes a table whose
columns are the union of the objects' keys (in order of first appearance). Nested values are shown as
compact JSON, so new or unknown columns are tolerated rather than dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_ROWS = 2000


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""
    truncated: int = 0  # rows left out past MAX_ROWS


@dataclass
class Document:
    source: str
    schema: str | None
    tables: list[Table] = field(default_factory=list)
    scalars: dict[str, Any] = field(default_factory=dict)
    # Ready-made charts: a top-level "figures" list of {"title", "data", "layout"} plotly specs (as
    # `wavefront trace analyze --figures` writes them) is drawn, not tabulated.
    figures: list[dict[str, Any]] = field(default_factory=list)


def _is_figure(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("data"), list) and isinstance(value.get("layout"), dict)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _cell(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return value


def records_table(title: str, records: list[dict[str, Any]]) -> Table:
    columns: list[str] = []
    for rec in records:
        for k in rec:
            if k not in columns:
                columns.append(str(k))
    shown = records[:MAX_ROWS]
    rows = [[_cell(rec.get(c)) for c in columns] for rec in shown]
    return Table(title, columns, rows, truncated=len(records) - len(shown))


def document_tables(doc: Any, source: str) -> Document:
    """Every list of records in `doc` (the document itself, or its fields, one level deep) as a table."""
    if _is_records(doc):
        return Document(source, None, [records_table(Path(source).name, doc)])
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: expected a JSON object or a list of objects, got {type(doc).__name__}")
    out = Document(source, doc.get("schema"))
    for key, value in doc.items():
        if key == "figures" and isinstance(value, list) and value and all(_is_figure(v) for v in value):
            out.figures = list(value)
        elif _is_records(value):
            out.tables.append(records_table(key, value))
        elif isinstance(value, dict):
            for sub, sub_value in value.items():
                if _is_records(sub_value):
                    out.tables.append(records_table(f"{key}.{sub}", sub_value))
            if not any(_is_records(v) for v in value.values()):
                out.scalars[key] = _cell(value)
        elif key != "schema":
            out.scalars[key] = _cell(value)
    return out


def load_document_tables(path: str | Path) -> Document:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read JSON document {path}: {exc}") from None
    return document_tables(doc, str(path))
