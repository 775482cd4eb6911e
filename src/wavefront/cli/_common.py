"""The verbs' shared vocabulary: option types, the one progress factory, tables that fit, one-line errors.

Verb modules import this module and cli._output, never each other. Choices are typer Enums and ranges
are typer min/max, so typer validates them and ``--help`` shows them; the choice lists mirror library
constants (tests/cli/test_common.py checks they agree) so that ``wavefront --help`` imports no torch.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from wavefront.cli._help import VerbCommand, VerbGroup, command  # noqa: F401
from wavefront.cli._output import (  # noqa: F401
    TEXT_MIN_WIDTH,
    FitTable,
    JsonOut,
    check_output,
    console,
    err_console,
    fail,
    output_option,
    table,
)
from wavefront.workbench.document import dumps
from wavefront.workbench.jobs.request import RequestError


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Mode(str, Enum):
    fwd = "fwd"
    bwd = "bwd"
    fwd_bwd = "fwd_bwd"


class Provider(str, Enum):
    wavefront = "wavefront"
    eager = "eager"
    torch_compile = "torch_compile"
    liger = "liger"
    vendor = "vendor"
    sdpa_flash = "sdpa_flash"
    sdpa_cudnn = "sdpa_cudnn"
    flash_attn = "flash_attn"
    grouped_mm = "grouped_mm"
    quack = "quack"


class Profiler(str, Enum):  # wavefront.workbench.jobs.profile.PROFILERS
    ncu = "ncu"
    nsys = "nsys"
    rocprof = "rocprof"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


#: The GPU compile targets of `wavefront inspect` (runtime.DEFAULT_TARGETS).
ALL_TARGETS = "sm_80,sm_90,sm_100,gfx90a,gfx942,gfx1100"

OpsOption = Annotated[list[str] | None, typer.Option("--op", help="Only this registered op (repeatable).")]
TargetsOption = Annotated[str, typer.Option(help="Comma-separated compile targets.")]


def write_json(doc: dict, dest: str | Path) -> None:
    """Write `doc` as JSON to `dest` ("-" is stdout). A destination that cannot be written is one line on
    stderr and exit 2 (the verbs check it before the job too: :func:`~wavefront.cli._output.output_problem`)."""
    text = dumps(doc) + b"\n"
    if str(dest) == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(text)
        sys.stdout.flush()
        return
    try:
        Path(dest).write_bytes(text)
    except OSError as exc:
        fail(f"cannot write {dest}: {exc.strerror or exc}")


def values(items: Sequence[Enum] | None) -> tuple[str, ...]:
    """Enum options as the plain strings the library requests take."""
    return tuple(i.value for i in items or ())


@contextlib.contextmanager
def request_errors() -> Iterator[None]:
    """A library RequestError (a bad request field) becomes one line naming its CLI option, exit 2."""
    try:
        yield
    except RequestError as exc:
        fail(f"--{exc.argument.replace('_', '-')}: {exc.message}")


class Bars:
    """The one progress factory: a bar per phase, each with its count, elapsed time and ETA, on stderr.
    ``bars.phase(name)`` is an ``on_progress(done, total, what)`` callback for the library jobs."""

    def __init__(self, enabled: bool = True):
        self._progress = Progress(TextColumn("[bold]{task.fields[phase]}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                  TextColumn("{task.description}"), console=err_console, disable=not enabled,
                                  transient=True)
        self._tasks: dict[str, object] = {}
        self._started = False

    def __enter__(self) -> Bars:
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            self._progress.stop()

    def update(self, phase: str, done: int, total: int, what: str = "") -> None:
        if not self._started:  # started on the first report: a job that fails at once prints no bar
            self._progress.start()
            self._started = True
        if phase not in self._tasks:
            self._tasks[phase] = self._progress.add_task("", total=None, phase=phase)
        self._progress.update(self._tasks[phase], completed=done, total=total or None, description=what)

    def phase(self, name: str) -> Callable[[int, int, str], None]:
        return lambda done, total, what="": self.update(name, done, total, what)


def note(text: str) -> None:
    """A dim note on stdout, one logical line (never broken inside a phrase by the terminal width)."""
    console.print(f"[dim]{text}[/]", soft_wrap=True, highlight=False)
