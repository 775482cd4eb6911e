"""Other tools' JSON documents (``wavefront inspect --json``, ``traffic --json``, ...) for the dashboard.

:func:`load_document` accepts the schemas in :data:`SHOWN_SCHEMAS` and refuses anything else with one line
naming the file and the schema, so a wrong file is an error rather than a silently empty section. Some
schemas get their own chart (inspect, traffic, the fused-loss memory result, trace figures); every list of
records in a document also becomes a table whose columns are the union of the records' keys, with the key
fields of known schemas first. Nested values are summarised (a list of kernels by their names, other
structures as compact JSON cut to :data:`MAX_CELL_CHARS`), so new or unknown fields are tolerated rather
than dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wavefront.workbench.counters.model import COMPARE_SCHEMA as COUNTERS_COMPARE
from wavefront.workbench.counters.model import SCHEMA as COUNTERS

MAX_ROWS = 2000
MAX_CELL_CHARS = 120

INSPECT, TRAFFIC, LCE_MEMORY, TRACE_FIGURES = (
    "wavefront.inspect/1",
    "wavefront.traffic/1",
    "wavefront.lce_memory/1",
    "wavefront.trace.figures/1",
)
#: Schemas with a chart of their own, then those shown as tables only.
CHARTED_SCHEMAS = (INSPECT, TRAFFIC, LCE_MEMORY, TRACE_FIGURES, COUNTERS, COUNTERS_COMPARE)
TABLE_SCHEMAS = (
    "wavefront.roofline/1",
    "wavefront.plan/1",
    "wavefront.plan.validation/1",
    "wavefront.comm/1",
    "wavefront.overlap/1",
    "wavefront.trace.analyze/1",
    "wavefront.trace.analyze/2",
    "wavefront.trace.diff/1",
    "wavefront.gate/1",
    "wavefront.compare/1",
    "wavefront.train/1",
)
SHOWN_SCHEMAS = CHARTED_SCHEMAS + TABLE_SCHEMAS

# Columns shown first (in this order) in the raw tables of known schemas; the rest follow as found.
KEY_COLUMNS = {
    INSPECT: [
        "key",
        "op",
        "mode",
        "case",
        "kernel",
        "target",
        "ok",
        "occupancy",
        "occupancy_limiter",
        "regs",
        "spill_bytes",
        "widest_load_bits",
        "widest_store_bits",
        "matrix_families",
        "shared_bytes",
        "num_warps",
    ],
    TRAFFIC: [
        "key",
        "op",
        "mode",
        "case",
        "bytes_moved",
        "min_bytes",
        "eager_bytes",
        "ratio_min",
        "ratio_eager",
        "marginal_ratio",
        "kernel_bytes",
        "host_bytes",
        "unique_bytes",
        "kernels",
        "error",
    ],
}
# Bulky columns moved to the end of those tables.
LAST_COLUMNS = {
    INSPECT: ["signature", "divisible_args", "load_widths", "store_widths", "matrix_ops", "error", "compile_s"],
    TRAFFIC: ["dims", "wall_s"],
}


class DocumentError(ValueError):
    """A JSON document the dashboard cannot show (unreadable, or a schema it does not know)."""


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
    body: Any = None  # the parsed JSON, for the schemas that get a chart of their own


def _is_figure(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("data"), list) and isinstance(value.get("layout"), dict)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _cell(value: Any) -> Any:
    if _is_records(value) and all("kernel" in v for v in value):
        return ", ".join(str(v["kernel"]) for v in value)
    if isinstance(value, dict | list):
        text = json.dumps(value, separators=(",", ":"), default=str)
        return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "\u2026"
    return value


def _ordered(columns: list[str], schema: str | None) -> list[str]:
    first = [c for c in KEY_COLUMNS.get(schema or "", []) if c in columns]
    last = [c for c in LAST_COLUMNS.get(schema or "", []) if c in columns and c not in first]
    return first + [c for c in columns if c not in first and c not in last] + last


def records_table(title: str, records: list[dict[str, Any]], schema: str | None = None) -> Table:
    columns: list[str] = []
    for rec in records:
        for k in rec:
            if k not in columns:
                columns.append(str(k))
    columns = _ordered(columns, schema)
    shown = records[:MAX_ROWS]
    rows = [[_cell(rec.get(c)) for c in columns] for rec in shown]
    return Table(title, columns, rows, truncated=len(records) - len(shown))


def document_tables(doc: Any, source: str) -> Document:
    """Every list of records in `doc` (the document itself, or its fields, one level deep) as a table."""
    if _is_records(doc):
        return Document(source, None, [records_table(Path(source).name, doc)], body=doc)
    if not isinstance(doc, dict):
        raise DocumentError(f"{source}: expected a JSON object or a list of objects, got {type(doc).__name__}")
    schema = doc.get("schema")
    out = Document(source, schema, body=doc)
    for key, value in doc.items():
        if key == "figures" and isinstance(value, list) and value and all(_is_figure(v) for v in value):
            out.figures = list(value)
        elif _is_records(value):
            out.tables.append(records_table(key, value, schema))
        elif isinstance(value, dict):
            for sub, sub_value in value.items():
                if _is_records(sub_value):
                    out.tables.append(records_table(f"{key}.{sub}", sub_value, schema))
            if not any(_is_records(v) for v in value.values()):
                out.scalars[key] = _cell(value)
        elif key != "schema":
            out.scalars[key] = _cell(value)
    return out


def check_document(doc: Any, source: str) -> str:
    """The document's schema if the dashboard shows it; DocumentError (one line) otherwise."""
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema not in SHOWN_SCHEMAS:
        what = f"schema {schema!r}" if schema else 'no "schema" field'
        raise DocumentError(
            f"{source}: {what}: not a document the dashboard shows (expected one of {', '.join(SHOWN_SCHEMAS)})"
        )
    if schema in (INSPECT, TRAFFIC):
        rows = doc.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DocumentError(f'{source}: {schema} document without a list of row objects in "rows"')
    if schema == TRACE_FIGURES and not (isinstance(doc.get("figures"), list) and all(map(_is_figure, doc["figures"]))):
        raise DocumentError(f'{source}: {schema} document without a list of plotly figures in "figures"')
    for sch, key in ((COUNTERS, "kernels"), (COUNTERS_COMPARE, "deltas")):
        if schema == sch and not (isinstance(doc.get(key), list) and all(isinstance(r, dict) for r in doc[key])):
            raise DocumentError(f'{source}: {schema} document without a list of objects in "{key}"')
    if schema == LCE_MEMORY and not isinstance(doc.get("full_logits_bytes"), int | float):
        raise DocumentError(f'{source}: {schema} document without "full_logits_bytes"')
    return schema


def parse_document(doc: Any, source: str) -> Document:
    """A checked document (see :func:`check_document`) with its tables."""
    check_document(doc, source)
    return document_tables(doc, source)


def load_document_tables(path: str | Path) -> Document:
    """Read and check the JSON document at `path`; DocumentError with one line if it cannot be shown."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DocumentError(f"cannot read JSON document {path}: {exc}") from None
    return parse_document(doc, str(path))
