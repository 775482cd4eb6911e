"""``--help`` of every verb, laid out so that nothing is cut at any terminal width.

Typer's help table measures its columns with rich's generic algorithm: short of width, it cuts option names
and choice lists mid-word (``--attention-kern…``, ``ve`` / ``ndor``) and prints ``<bool>`` after every flag.
Here each panel is two columns: the option's names, whole (a ``--no-`` form on its own line), and one text
that wraps between words: the value it takes (``fwd | bwd | fwd_bwd``, ``<int range>``; nothing for a flag),
then the help with its default and range. Panels, usage and help text are otherwise typer's.
"""

from __future__ import annotations

import inspect
from collections import defaultdict

from rich.console import Console
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperOption


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
    if hasattr(command, "list_commands"):
        subs = [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]
        _panel(console, "Commands", [(Text(name, style="bold cyan"), Text((_paragraphs(sub.help) or [""])[0]))
                                     for name, sub in subs if sub is not None and not sub.hidden])
