"""Output helpers shared by the verbs: rich consoles, one-line errors, tables that fit, checked output paths.
Nothing here imports the workbench: the root group's help and usage errors use this module
(JSON documents are written by :func:`wavefront.cli._common.write_json`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def output_problem(dest: str | Path) -> str | None:
    """Why a file the command would write at `dest` cannot be written, or None; checked before the job runs.
    A missing directory is an error, never created: a typo in a path should not cost a whole run. An
    existing file is opened for appending (nothing written); a new one is created and removed again."""
    if str(dest) in ("", "-"):
        return None
    path = Path(dest)
    if path.is_dir():
        return f"{str(dest)!r} is a directory; give a file name"
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        return f"cannot write {str(dest)!r}: a file is in the path ({str(parent)!r})"
    if parent != path.parent:
        return f"cannot write {str(dest)!r}: the directory {str(path.parent)!r} does not exist (create it first)"
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        return f"cannot write {str(dest)!r}: {exc.strerror or exc}"
    if not existed:
        path.unlink(missing_ok=True)
    return None


def fail(message: str, code: int = 2) -> None:
    """Print one clear line on stderr (never wrapped at the terminal width) and exit non-zero (no stack
    trace)."""
    text = " ".join(str(message).split())
    err_console.print(f"[bold red]error:[/] {escape(text)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


#: The narrowest a wrapping text column gets before low-value columns are dropped instead.
TEXT_MIN_WIDTH = 14


class FitTable:
    """A table that never cuts a number. Numeric columns never wrap or truncate; text columns fold (wrap
    anywhere) down to TEXT_MIN_WIDTH; columns empty in every row ("", "-") are hidden; and if the table
    still does not fit the terminal, the `droppable` columns go, in order (their values stay in --json)."""

    def __init__(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                 numeric: Sequence[str] = (), droppable: Sequence[str] = ()):
        self.title, self.headers, self.rows = title, list(headers), [list(map(str, r)) for r in rows]
        self.numeric, self.droppable = set(numeric), list(droppable)
        self.keep = [h for i, h in enumerate(headers)
                     if not rows or any(str(r[i]).strip() not in ("", "-") for r in rows)]
        self.dropped: list[str] = []

    def build(self, keep: Sequence[str], narrowest: bool = False):
        out = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                    collapse_padding=True)
        idx = [self.headers.index(h) for h in keep]
        for h in keep:
            num = h in self.numeric
            out.add_column(h, justify="right" if num else "left", no_wrap=num, overflow="fold",
                           min_width=None if num else TEXT_MIN_WIDTH,
                           width=TEXT_MIN_WIDTH if narrowest and not num else None)
        for r in self.rows:
            out.add_row(*(r[i] for i in idx))
        return out

    def __rich_console__(self, console, options):
        keep = list(self.keep)
        unbounded = options.update(max_width=1 << 16)
        for name in self.droppable:
            # The narrowest layout: text columns at their minimum, numbers whole.
            if Measurement.get(console, unbounded, self.build(keep, narrowest=True)).maximum <= options.max_width:
                break
            if name in keep:
                keep.remove(name)
                self.dropped.append(name)
        yield self.build(keep)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: Sequence[str] = (),
          droppable: Sequence[str] = ()) -> FitTable:
    """See :class:`FitTable`."""
    return FitTable(title, headers, rows, numeric=numeric, droppable=droppable)


def check_output(ctx: typer.Context, param: typer.CallbackParam, value):
    """Option callback for a file the command writes: checked before the job runs (:func:`output_problem`),
    so a path into a missing directory or a directory is one line, exit 2, not a finished job whose result is
    lost (or a directory created without asking). A default value is the project's own layout: not checked."""
    source = ctx.get_parameter_source(param.name or "")
    if value is None or (source is not None and source.name.startswith("DEFAULT")):
        return value
    if os.environ.get("RANK", "0") != "0":  # the other ranks of a launch: rank 0 checks (and writes) alone
        return value
    why = output_problem(str(value))
    if why:
        raise typer.BadParameter(why)
    return value


def output_option(*names: str, help: str) -> typer.models.OptionInfo:  # noqa: A002 - typer's own keyword
    """``typer.Option`` for a file the command writes (see :func:`check_output`)."""
    return typer.Option(*names, help=help, callback=check_output)


JsonOut = Annotated[str | None, output_option("--json", help="Write the result document to this file ('-': stdout).")]
