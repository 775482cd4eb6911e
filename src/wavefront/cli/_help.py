"""The verbs' usage: ``--help`` laid out so that nothing is cut at any terminal width, and usage errors as
the project's one line (:class:`VerbCommand`, :class:`VerbGroup`).

Typer's help table measures its columns with rich's generic algorithm: short of width, it cuts option names
and choice lists mid-word (``--attention-kern…``, ``ve`` / ``ndor``) and prints ``<bool>`` after every flag.
Here each panel is two columns: the option's names, whole (a ``--no-`` form on its own line), and one text
that wraps between words: the value it takes (``fwd | bwd | fwd_bwd``, ``<int range>``; nothing for a flag),
then the help with its default and range. Panels, usage and help text are otherwise typer's.

The root group (:class:`LazyVerbGroup`) loads a verb's module only when the verb is looked up: its help lists
each verb with the one-line summary of its :class:`Verb` row, without importing any verb module.
"""

from __future__ import annotations

import importlib
import inspect
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import ClassVar, NamedTuple

import typer
from rich.console import Console
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from wavefront.cli._output import fail


def _paragraphs(doc: str | None) -> list[str]:
    return [" ".join(p.split()) for p in inspect.cleandoc(doc or "").split("\n\n") if p.strip()]


def _value(p, ctx) -> str:
    """What the option takes: nothing for a flag, the choices as words, else typer's type."""
    if isinstance(p, TyperOption) and p.is_flag:
        return ""
    desc = p.type_descriptor
    if desc.is_choice:
        return " | ".join(str(getattr(c, "value", c)) for c in desc.choices or ())
    return p.display_type(ctx)


def _row(p, ctx) -> tuple[Text, Text]:
    if isinstance(p, TyperArgument):
        names = Text(p.display_name_raw + ("..." if p.nargs != 1 else ""), style="bold cyan")
    else:
        names = Text("\n".join([", ".join(p.opts), *p.secondary_opts]), style="bold cyan")
    record = p.get_help_record(ctx)
    value = _value(p, ctx)
    text = Text(value + "  ", style="yellow") if value else Text()
    return names, text.append(" ".join((record[1] if record else "").split()))


def _panel(console: Console, title: str, rows: list[tuple[Text, Text]]) -> None:
    if not rows:
        return
    grid = Table.grid(padding=(0, 2), expand=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    for row in rows:
        grid.add_row(*row)
    console.print(Panel(grid, title=title, title_align="left", border_style="dim"))


def print_help(command, ctx) -> None:
    """The help of ``command`` (a verb or a group of verbs) on stdout."""
    console = Console(highlight=False)
    console.print(Padding(Text(command.get_usage(ctx), style="bold"), 1))
    for paragraph in _paragraphs(command.help):
        console.print(Padding(Text(paragraph), (0, 1, 1, 1)))
    panels: dict[str, list] = defaultdict(list)
    for p in command.get_params(ctx):
        if not getattr(p, "hidden", False) and isinstance(p, TyperArgument | TyperOption):
            default = "Arguments" if isinstance(p, TyperArgument) else "Options"
            panels[getattr(p, "rich_help_panel", None) or default].append(_row(p, ctx))
    for title in ("Arguments", "Options", *(t for t in panels if t not in ("Arguments", "Options"))):
        _panel(console, title, panels.get(title, []))
    if isinstance(command, VerbGroup):
        _panel(console, "Commands", [(Text(name, style="bold cyan"), Text(text))
                                     for name, text in command.summaries(ctx)])


#: click's UsageError as this typer uses it (typer >= 0.26 ships its own copy of click): the base of a bad
#: choice, a value out of range, a missing option, an unknown option or command.
_UsageError = typer.BadParameter.__mro__[1]


def _usage_error(exc) -> None:
    """One line on stderr, exit 2: a bad value named by its option, like every other bad input; the rest
    with where to read the usage. ``no_args_is_help`` raises one too, after printing the help: it goes on."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        raise exc
    ctx, param, text = getattr(exc, "ctx", None), getattr(exc, "param", None), getattr(exc, "message", "")
    if isinstance(exc, typer.BadParameter) and param is not None and text:  # not a missing one: no message
        fail(f"{param.opts[0] if param.opts else param.name}: {text.replace('Value error, ', '')}")
    fail(exc.format_message() + (f" (usage: {ctx.command_path} --help)" if ctx is not None else ""))


class _Usage:
    """Usage errors (a bad choice, a value out of range, a missing or unknown option or command) as one line on
    stderr and exit 2, like every other bad input, instead of typer's usage panel; help by :func:`print_help`."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _UsageError as exc:  # typer converts and checks values when it invokes the command
            _usage_error(exc)

    def format_help(self, ctx, formatter) -> None:
        print_help(self, ctx)


class VerbCommand(_Usage, TyperCommand):
    """A verb (``wavefront plan``, ``wavefront trace analyze``)."""


class VerbGroup(_Usage, TyperGroup):
    """A group of verbs (``wavefront``, ``wavefront trace``): an unknown command too is one line."""

    def summaries(self, ctx) -> list[tuple[str, str]]:
        """(name, the first paragraph of its help) per visible command, for the help's command panel."""
        subs = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        return [(name, (_paragraphs(sub.help) or [""])[0]) for name, sub in subs if sub is not None and not sub.hidden]


class Verb(NamedTuple):
    """A verb of the root group: the module whose ``register(app)`` adds it, and its line in ``--help``."""

    module: str
    summary: str
    torch_free: bool = False


class _LazyCommands(Mapping):
    """The root group's commands by name: the names are the table's; a verb's module is imported, and every
    command it registers is built, on the first lookup of one of them."""

    def __init__(self, verbs: Mapping[str, Verb]):
        self._verbs = verbs
        self._built: dict[str, object] = {}  # name -> its click command

    def __getitem__(self, name: str):
        if name not in self._built:
            scratch = typer.Typer()
            importlib.import_module(self._verbs[name].module).register(scratch)
            self._built.update(typer.main.get_group(scratch).commands)
        return self._built[name]

    def __contains__(self, name: object) -> bool:
        return name in self._verbs

    def __iter__(self) -> Iterator[str]:
        return iter(self._verbs)

    def __len__(self) -> int:
        return len(self._verbs)


class LazyVerbGroup(VerbGroup):
    """The root group over a table of :class:`Verb` rows (``verbs``, set by a subclass): the commands load on
    use, and the help lists the rows' summaries without importing any verb module."""

    verbs: ClassVar[Mapping[str, Verb]] = {}

    def __init__(self, **attrs):
        super().__init__(**attrs)
        self.commands = _LazyCommands(self.verbs)

    def get_command(self, ctx, cmd_name: str):
        return self.commands[cmd_name] if cmd_name in self.verbs else None  # a load's own KeyError propagates

    def list_commands(self, ctx) -> list[str]:
        return list(self.verbs)

    def summaries(self, ctx) -> list[tuple[str, str]]:
        return [(name, verb.summary) for name, verb in self.verbs.items()]


def command(app: typer.Typer, name: str) -> Callable:
    """``app.command(name)`` with one-line usage errors and plain help."""
    return app.command(name, cls=VerbCommand)
