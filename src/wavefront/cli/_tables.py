"""The inspect table: rows that never wrap at any terminal width (the name column cut, droppable columns
dropped), in parts that line up as one table."""

from __future__ import annotations


class OneLineTable:
    """Rows that never wrap: every figure whole, the name column (the first) cut with an ellipsis to the space
    left, and when even a 16-character name does not fit, the `droppable` columns go, in order (--json keeps
    everything). Rows whose other cells are all empty are headings (an op and mode) over their kernels."""

    NAME_MIN = 16

    def __init__(self, title: str, headers: list[str], rows: list[list[str]], droppable: list[str]):
        self.title, self.headers, self.rows = title, headers, rows
        self.droppable = [h for h in droppable if h in headers]
        self.dropped: list[str] = []

    def __rich_console__(self, console, options):
        from rich.table import Table
        from rich.text import Text

        def width(cell: str) -> int:
            return Text.from_markup(cell).cell_len

        keep = list(range(len(self.headers)))
        widths = [max([width(self.headers[i]), *(width(r[i]) for r in self.rows if len(r) > 1)]) for i in keep]
        for name in [None, *self.droppable]:
            if name is not None:
                keep.remove(self.headers.index(name))
                self.dropped.append(name)
            # One space between columns.
            if options.max_width - sum(widths[i] + 1 for i in keep[1:]) >= self.NAME_MIN:
                break
        name_w = max(self.NAME_MIN, min(widths[0], options.max_width - sum(widths[i] + 1 for i in keep[1:])))

        def part(rows: list[list[str]], header: bool) -> Table:
            # Every part has the same column widths, so the parts line up as one table.
            out = Table(box=None, show_header=header, header_style="bold underline", show_edge=False,
                        pad_edge=False, padding=(0, 0, 0, 1))  # one space before every column but the first
            for i in keep:
                out.add_column(self.headers[i], justify="left" if i == 0 else "right", no_wrap=True,
                               overflow="ellipsis", width=name_w if i == 0 else widths[i])
            for r in rows:
                out.add_row(*(r[i] for i in keep))
            return out

        yield Text(self.title, overflow="fold")
        yield part([], True)
        chunk: list[list[str]] = []
        for r in [*self.rows, ["(end)"]]:
            if len(r) > 1:
                chunk.append(r)
                continue
            if chunk:  # a heading row ends the rows before it
                yield part(chunk, False)
                chunk = []
            if r != ["(end)"]:
                yield Text(r[0], style="bold", overflow="ellipsis", no_wrap=True)
        if self.dropped:
            yield Text(f"not shown at this width: {', '.join(self.dropped)} (--json has every field)", style="dim")
