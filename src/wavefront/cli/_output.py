"""Output helpers shared by the verbs: JSON documents and rich consoles."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become null (JSON has no NaN/inf), tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def write_json(doc: dict, dest: str | Path) -> None:
    """Write `doc` as JSON to `dest` ("-" is stdout)."""
    text = json.dumps(_clean(doc), indent=2, sort_keys=False)
    if str(dest) == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_text(text + "\n")


def fail(message: str, code: int = 2) -> None:
    """Print one clear line on stderr (never wrapped at the terminal width) and exit non-zero (no stack
    trace)."""
    import typer
    from rich.markup import escape

    text = " ".join(str(message).split())
    err_console.print(f"[bold red]error:[/] {escape(text)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)
