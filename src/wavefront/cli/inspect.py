"""`wavefront inspect`, `wavefront traffic`, `wavefront roofline`: machine code, bytes and roofs without a GPU.
The jobs are wavefront.workbench.static.jobs; this module declares options and renders tables that never cut
a number (text columns wrap, always-empty columns are hidden)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from wavefront.cli._common import (
    ALL_TARGETS,
    Bars,
    DType,
    JsonOut,
    OpsOption,
    TargetsOption,
    command,
    note,
    request_errors,
    table,
)
from wavefront.cli._output import console, write_json

_LIMITER = {"registers": "regs", "shared": "smem", "warps": "max", "blocks": "blocks", "none": "",
            "does-not-fit": "no fit"}


def _bits(b: int | None) -> str:
    return str(b) if b else "-"


def _regs(r) -> str:
    return str(r.regs) if r.sgprs is None else f"{r.regs}v {r.sgprs}s" + (f" {r.agprs}a" if r.agprs else "")


def _kernel_name(name: str) -> str:
    """A kernel's name without the noise every one of them carries: the leading underscore, "_kernel"."""
    base, _, again = name.partition("#")
    base = base.lstrip("_").removesuffix("_kernel")
    return base + (f"#{again}" if again else "")


def _kib(b: int) -> str:
    return "0" if not b else f"{b / 1024:.0f}K" if b >= 1024 else f"{b}B"


def _opt_int(x: int | None) -> str:
    return "-" if x is None else str(x)


class OneLineTable:
    """Rows that never wrap: every figure whole, the name column (the first) cut with an ellipsis to the space
    left, and when even a 16-character name does not fit, the `droppable` columns go, in order (--json keeps
    everything). Rows whose other cells are all empty are headings (an op and mode) over their kernels."""

    NAME_MIN = 16

    def __init__(self, title: str, headers: list[str], rows: list[list[str]], droppable: list[str]):
        self.title, self.headers, self.rows, self.droppable = title, headers, rows, droppable
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


#: What "-" means in each column of the inspect tables.
INSPECT_LEGEND = ("-: none in the machine code (ld/st: no plain global load/store, e.g. TMA moves the data; mma: no "
                  "matrix instruction; wait: no wgmma main loop). occ: resident warps per SM (NVIDIA) or waves per "
                  "SIMD (AMD) as a share of the most, and what limits it; ld/st: widest global load/store in bits "
                  "(yellow: under 128); tma: TMA/bulk-copy instructions; nreg: setmaxnreg (warp specialization); "
                  "wait: smallest wgmma wait depth in the main loop (0: serialized).")


def _design(r) -> list[str]:
    return [str(r.tma_ops) if r.tma_ops else "-", str(r.setmaxnreg) if r.setmaxnreg else "-",
            _opt_int(r.mma_wait_depth)]


def _narrow(bits: int) -> str:
    return _bits(bits) if bits >= 128 or not bits else f"[yellow]{bits}[/]"


def inspect_table(report, all_rows: bool = False) -> OneLineTable:
    """The terminal view of an inspect report, one line per row. Default: one row per kernel x target over
    all of an op's cases, each figure its worst case (most registers, spills and shared memory, least
    occupancy, narrowest access), under a heading per op and mode; `all_rows`: one row per case."""
    groups: dict[tuple, list] = {}
    for r in report.rows:
        key = (r.op, r.mode) + ((r.case,) if all_rows else ()) + (_kernel_name(r.kernel), r.target)
        groups.setdefault(key, []).append(r)
    rows: list[list[str]] = []
    heading = None
    for key, rs in groups.items():
        if key[:-2] != heading:
            heading = key[:-2]
            rows.append([" ".join(heading)])
        failed = [r for r in rs if not r.ok]
        ok = [r for r in rs if r.ok]
        name = "  " + key[-2]
        if not ok:
            rows.append([name, key[-1], str(len(rs)), *["-"] * 10, f"[red]FAILED: {escape(str(failed[0].error))}[/]"])
            continue
        warps = sorted({r.num_warps for r in ok})
        worst_regs = max(ok, key=lambda r: r.regs)
        spill = max(r.spill_bytes for r in ok)
        occ = min(ok, key=lambda r: r.occupancy)
        ld, st = min(r.widest_load_bits for r in ok), min(r.widest_store_bits for r in ok)
        depths = [r.mma_wait_depth for r in ok if r.mma_wait_depth is not None]
        design = _design(ok[0]) if all_rows else [str(max(r.tma_ops for r in ok) or "-"),
                                                  str(max(r.setmaxnreg for r in ok) or "-"),
                                                  _opt_int(min(depths) if depths else None)]
        families = sorted({f for r in ok for f in r.matrix_families})
        rows.append([name, key[-1], str(len(rs)), "-".join(map(str, dict.fromkeys([warps[0], warps[-1]]))),
                     _regs(worst_regs) if all_rows else str(worst_regs.regs), f"[red]{spill}[/]" if spill else "0",
                     _kib(max(r.shared_bytes for r in ok)),
                     f"{occ.occupancy:.0%} {_LIMITER.get(occ.occupancy_limiter, occ.occupancy_limiter)}".strip(),
                     f"{_narrow(ld)}/{_narrow(st)}", ",".join(families) or "-", *design,
                     f"[red]{len(failed)} failed[/]" if failed else ""])
    headers = ["op mode / kernel", "target", "cases", "warps", "regs", "spill", "smem", "occ", "ld/st", "mma",
               "tma", "nreg", "wait", "note"]
    if all_rows:
        rows = [r[:2] + r[3:] if len(r) > 1 else r for r in rows]
        headers.remove("cases")
    if not any(len(r) > 1 and r[-1] for r in rows):
        rows = [r[:-1] if len(r) > 1 else r for r in rows]
        headers = headers[:-1]
    title = (f"compiled kernels at bench shapes ({report.dtype})" if all_rows else
             f"compiled kernels at bench shapes ({report.dtype}), worst case per kernel (--all: every case)")
    return OneLineTable(title, headers, rows, droppable=[h for h in ("cases", "warps", "smem") if h in headers])


def inspect_cmd(op: OpsOption = None, targets: TargetsOption = ALL_TARGETS,
                dtype: Annotated[DType, typer.Option(help="Input dtype of the bench cases.")] = DType.bf16,
                asm: Annotated[Path | None, typer.Option("--asm", help="Also write each kernel's PTX/SASS or AMDGCN "
                                                                       "here.")] = None,
                workers: Annotated[int | None, typer.Option(min=1, help="Compile worker processes (default: CPU "
                                                                        "count, <= 8).")] = None,
                all_rows: Annotated[bool, typer.Option("--all", help="One terminal row per case (default: one per "
                                                                     "kernel x target, its worst case).")] = False,
                json_out: JsonOut = None) -> None:
    """Compile every registered op's kernels at its bench shapes for GPU targets (no GPU needed) and report
    registers, spills, shared memory/LDS, occupancy, the widest global load/store, matrix instructions and
    the design (TMA, setmaxnreg, wgmma wait depth)."""
    from wavefront.workbench.static import jobs

    show = json_out != "-"
    with request_errors(), Bars(show) as bars:
        req = jobs.InspectRequest(ops=tuple(op or ()), targets=jobs.split_targets(targets), dtype=dtype.value,
                                  asm_dir=str(asm) if asm else None, workers=workers)
        report = jobs.inspect(req, bars.phase("compile"))
    if show:
        view = inspect_table(report, all_rows)
        console.print(view)
        console.print(f"[dim]{INSPECT_LEGEND}[/]", highlight=False)
        if view.dropped:
            console.print(f"[dim]not shown at this width: {', '.join(view.dropped)} (--json has every field)[/]",
                          highlight=False)
        n_spill = sum(r.spills for r in report.rows)
        console.print(f"{len(report.rows)} kernel x target x case rows, {len(report.failed)} failed to compile, "
                      f"{n_spill} with spills", highlight=False)
    if json_out:
        write_json(report.as_dict(), json_out)
    if report.failed:
        raise typer.Exit(1)


def _ratio(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"


def traffic_table(report):
    """Bytes the op moves (kernels + host work) against its minimum and eager; raw counts in --json."""
    rows = []
    for r in report.rows:
        dims = "x".join(str(v) for v in r.dims.values())
        if r.error:
            rows.append([f"{r.op} {r.mode} {r.case}", dims, "-", "-", "-", "-", "-", f"[red]{escape(r.error)}[/]"])
            continue
        per_row = _ratio(r.marginal_ratio)
        if r.marginal_ratio is not None and r.marginal_ratio > 1.005:
            per_row = f"[yellow]{per_row}[/]"
        rows.append([f"{r.op} {r.mode} {r.case}", dims, f"{r.bytes_moved:,}", f"{r.min_bytes:,}", _ratio(r.ratio_min),
                     per_row, _ratio(r.ratio_eager), ""])
    return table(f"bytes moved ({report.dtype}; counted by the Triton interpreter)",
                 ["op mode case", "dims", "ours B", "min B", "ours/min", "per row", "eager/ours", "error"], rows,
                 numeric=["dims", "ours B", "min B", "ours/min", "per row", "eager/ours"],
                 droppable=["dims", "eager/ours"])


def traffic_cmd(op: OpsOption = None,
                dtype: Annotated[DType, typer.Option(help="Input dtype.")] = DType.bf16,
                marginal: Annotated[bool, typer.Option(help="Also run taller cases for the per-row ratio.")] = True,
                json_out: JsonOut = None) -> None:
    """Count the bytes each op's kernels load and store (instrumented Triton interpreter) at small versions
    of its bench cases; compare with the op's minimum and with eager PyTorch."""
    from wavefront.workbench.static import jobs

    show = json_out != "-"
    with request_errors(), Bars(show) as bars:
        report = jobs.traffic(jobs.TrafficRequest(ops=tuple(op or ()), dtype=dtype.value, marginal=marginal),
                              bars.phase("traffic"))
    if show:
        console.print(traffic_table(report))
        note("ours: kernel + host bytes; ours/min: over the minimum at this case; per row: extra bytes per extra row "
             "over the minimum's. CPU interpreter: wall times are not performance figures.")
    if json_out:
        write_json(report.as_dict(), json_out)
    if any(r.error for r in report.rows):
        raise typer.Exit(1)


def _opt(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def roofline_table(report):
    """One line per op x mode x case; columns without a value in any row (no traffic, no measurement) hidden."""
    g = report.device
    rows = [[f"{p.op} {p.mode} {p.case}", f"{p.intensity:.2f}", p.compute_roof, p.bound, f"{p.min_bytes / 1e6:.1f}",
             f"{p.attainable_us:.1f}", _opt(p.kernel_attainable_us, ".1f"), _opt(p.measured_us, ".1f"),
             "-" if p.pct_of_roof is None else f"{p.pct_of_roof:.0f}%"] for p in report.points]
    return table(f"roofline on {g.name} ({report.dtype}, modeled)",
                 ["op mode case", "FLOP/B", "roof", "bound", "min MB", "roof us", "kernel us", "measured us",
                  "% of roof"], rows,
                 numeric=["FLOP/B", "min MB", "roof us", "kernel us", "measured us", "% of roof"],
                 droppable=["roof", "min MB"])


def roofline_cmd(
    device: Annotated[str, typer.Option(help="A device-table name: a100, h100, h200, b200, mi300x, mi325x, "
                                              "mi250x, w7900.")] = "h100",
    op: OpsOption = None,
    dtype: Annotated[DType, typer.Option(help="Input dtype.")] = DType.bf16,
    traffic: Annotated[Path | None, typer.Option(help="A `wavefront traffic --json` document: adds the roof "
                                                      "for the bytes the kernels really move.")] = None,
    inspect_json: Annotated[Path | None, typer.Option("--inspect", help="A `wavefront inspect --json` document: "
                                                      "which ops use matrix units (else read from Triton's IR).")]
        = None,
    measured: Annotated[Path | None, typer.Option(help="Measured times (JSON records with op, case, mode, "
                                                       "dtype, device, dur_us) from real GPU runs.")] = None,
    store: Annotated[Path | None, typer.Option(help="A results store: take the measured times of its run "
                                                    "--run (a GPU run of `wavefront bench`).")] = None,
    run: Annotated[str, typer.Option(help="The stored run to read with --store.")] = "latest",
    json_out: JsonOut = None,
) -> None:
    """Arithmetic intensity, attainable time on a device of the table and, given measured times, the
    achieved percentage of the roof, for every bench case of every registered op."""
    from wavefront.workbench.static import jobs

    req = jobs.RooflineRequest(device=device, ops=tuple(op or ()), dtype=dtype.value,
                               traffic=str(traffic) if traffic else None,
                               inspect=str(inspect_json) if inspect_json else None,
                               measured=str(measured) if measured else None, store=str(store) if store else None,
                               run=run)
    with request_errors():
        report = jobs.roofline(req)
    if json_out != "-":
        console.print(roofline_table(report))
        g = report.device
        note(f"Modeled from the device table's dense peaks ({g.hbm_tbps} TB/s, vector FP32 {g.fp32_tflops} TFLOPS, "
             f"{report.dtype} matrix {g.bf16_tflops} TFLOPS): not a measurement. roof us: attainable time.")
    if json_out:
        write_json(report.as_dict(), json_out)


def register(app: typer.Typer) -> None:
    command(app, "inspect")(inspect_cmd)
    command(app, "traffic")(traffic_cmd)
    command(app, "roofline")(roofline_cmd)
