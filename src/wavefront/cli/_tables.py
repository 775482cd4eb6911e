"""The inspect tables: rows that never wrap at any terminal width (the name column cut, droppable columns
dropped), in parts that line up as one table; the launch-configuration list."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from wavefront.cli._common import table
from wavefront.workbench.static.inspect import summarize


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


def _narrow(bits: int) -> str:
    return str(bits) if bits >= 128 else f"[yellow]{bits}[/]" if bits else "-"


def inspect_table(report, all_rows: bool = False) -> OneLineTable:
    """One line per kernel x target, its worst case over the op's cases (`all_rows`: per case), under a heading
    per op and mode (and case). Kernels that failed to compile are listed under the table."""
    rows: list[list[str]] = []
    for k in (k for k in summarize(report, all_rows) if k.ok):
        if (heading := " ".join(x for x in (k.op, k.mode, k.case) if x)) not in (r[0] for r in rows if len(r) == 1):
            rows.append([heading])  # summarize() keeps each op, mode (and case) together
        warps, regs, occ = sorted({r.num_warps for r in k.ok}), k.worst("regs"), k.worst("occupancy", most=False)
        spill, smem = k.worst("spill_bytes").spill_bytes, k.worst("shared_bytes").shared_bytes
        rows.append(["  " + k.kernel, k.target, *([] if all_rows else [str(len(k.ok))]),
                     "-".join(map(str, dict.fromkeys([warps[0], warps[-1]]))),
                     regs.regs_text if all_rows else str(regs.regs), f"[red]{spill}[/]" if spill else "0",
                     f"{smem / 1024:.0f}K" if smem >= 1024 else f"{smem}B" if smem else "0", occ.occupancy_text,
                     f"{_narrow(k.worst('widest_load_bits', False).widest_load_bits)}/"
                     f"{_narrow(k.worst('widest_store_bits', False).widest_store_bits)}",
                     ",".join(sorted({f for r in k.ok for f in r.matrix_families})) or "-",
                     str(k.worst("tma_ops").tma_ops or "-"), str(k.worst("setmaxnreg").setmaxnreg or "-"),
                     "-" if k.wait_depth is None else str(k.wait_depth)])
    headers = ["op mode / kernel", "target", "cases", "warps", "regs", "spill", "smem", "occ", "ld/st", "mma", "tma",
               "nreg", "wait"]
    what = "every case" if all_rows else "worst case of each (--all: every case)"
    return OneLineTable(f"kernels compiled at bench shapes ({report.dtype}): {what}",
                        [h for h in headers if not (all_rows and h == "cases")], rows, ["cases", "warps", "smem"])


def configs_table(found):
    """One line per distinct configuration: op, target, the bench cases choosing it, its small problem."""
    rows = []
    for c in found.configs:
        small = ("[red]none: " + escape(c.note) + "[/]" if c.small is None else
                 " ".join(f"{k}={v}" for k, v in c.small.dims.items()) + f" sms={c.small_n_sms}")
        kernels = ", ".join(sorted({k.split(":", 1)[1].split("[", 1)[0] for k in c.key}))
        rows.append([c.op, c.target, f"{c.id.rsplit('-', 1)[1]}", ", ".join(c.bench_cases), kernels, small])
    for e in found.excluded:
        rows.append([e.op, e.target, e.name, ", ".join(e.bench_cases), "-", f"[yellow]not run: {escape(e.reason)}[/]"])
    return table(f"launch configurations at bench shapes ({found.dtype})",
                 ["op", "target", "key", "bench cases", "kernels", "small problem"], rows, numeric=["target"],
                 droppable=["kernels"])
