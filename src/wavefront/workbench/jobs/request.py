"""What every job shares: the one error type for a bad request, the one progress signature, and reading
another verb's JSON document. Torch-free (the trace, plan and counters jobs run where only numpy is installed).

A job is ``verb(request, on_progress=None) -> result``: a frozen request dataclass in, a result that carries
``SCHEMA`` and ``as_dict()`` (its JSON document, :mod:`wavefront.workbench.document`) out. A field with a bad
value raises :class:`RequestError` naming the field (the CLI option of the same name; exit 2 there).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

#: on_progress(done, total, what): called as the job advances (total 0 while unknown).
ProgressFn = Callable[[int, int, str], None]
#: A job of several phases (bench: correctness, timing, inspect, traffic) asks for one ProgressFn per phase.
PhaseProgress = Callable[[str], ProgressFn]

DTYPES = ("fp32", "bf16", "fp16")


class RequestError(ValueError):
    """A request field holds a bad value; ``argument`` names the field (and the CLI option)."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument
        self.message = message


def no_progress(done: int, total: int, what: str = "") -> None:
    """The ProgressFn of a caller that wants none."""


def phases(progress: PhaseProgress | None) -> PhaseProgress:
    """`progress`, or one that reports nothing."""
    return progress or (lambda phase: no_progress)


def read_document(path: str | Path, kind: str, argument: str | None = None, row_keys: tuple[str, ...] = ()) -> dict:
    """A ``wavefront <kind> --json`` document: an object whose ``rows`` is a list of objects (each holding
    `row_keys`), and whose ``schema``, when present, is ``wavefront.<kind>/N``. Else a RequestError."""
    argument = argument or kind
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RequestError(argument, f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(argument, f"{path} is not a `wavefront {kind} --json` document (not a JSON object)")
    schema = doc.get("schema")
    if schema is not None and not str(schema).startswith(f"wavefront.{kind}/"):
        raise RequestError(argument, f"{path} has schema {schema!r}; expected a `wavefront {kind} --json` "
                                     f"document (wavefront.{kind}/1)")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        what = "no 'rows'" if rows is None else "'rows' that is not a list of objects"
        raise RequestError(argument, f"{path} has {what}: not a `wavefront {kind} --json` document")
    for i, r in enumerate(rows):
        missing = [k for k in row_keys if k not in r]
        if missing:
            raise RequestError(argument, f"{path}: row {i} lacks {', '.join(missing)}: not a `wavefront {kind} "
                                         "--json` document")
    return doc
