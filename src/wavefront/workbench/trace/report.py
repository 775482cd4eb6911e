"""The analysis as text blocks for a terminal: rules, lines and tables as plain data (strings), with a
priority per column so that a renderer short of width drops the least useful columns whole instead of
cutting numbers. The CLI (``wavefront trace analyze``) renders them; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wavefront.workbench.trace.analysis import RankAnalysis, TraceAnalysis
from wavefront.workbench.trace.breakdown import CATEGORIES
from wavefront.workbench.trace.diff import TraceDiff
from wavefront.workbench.trace.multirank import MultiRankReport

SHORT_LABELS = {"compute": "compute", "comm_overlapped": "comm hidden", "comm_exposed": "comm exposed",
                "memory": "memcpy", "idle_host_bound": "idle host", "idle_other": "idle other"}
KEEP = 100  # priority of a column that is never dropped
# A per-step table shows at most this many steps: the first and the last halves, with a row saying how
# many were left out (every step is in --json). Thousands of rows help no reader and cost seconds to lay out.
MAX_STEP_ROWS = 40


@dataclass
class Column:
    header: str
    numeric: bool = True
    priority: int = KEEP  # lower is dropped first when the table is too wide


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    bold_rows: set[int] = field(default_factory=set)


@dataclass
class Block:
    kind: str  # "rule" | "warning" | "note" | "line" | "table"
    text: str = ""
    table: Table | None = None


def _ms(us: float) -> str:
    return f"{us / 1e3:,.3f}"


def _shown(steps: list[Any]) -> tuple[list[Any], list[Any], int]:
    """The steps printed before and after the elision, and how many are left out."""
    if len(steps) <= MAX_STEP_ROWS:
        return steps, [], 0
    half = MAX_STEP_ROWS // 2
    return steps[:half], steps[-half:], len(steps) - 2 * half


def _step_rows(t: Table, steps: list[Any], row: Callable[[Any], list[str]]) -> None:
    head, tail, left_out = _shown(steps)
    t.rows.extend(row(s) for s in head)
    if left_out:
        t.rows.append([f"({left_out:,} more)", *["…"] * (len(t.columns) - 1)])
    t.rows.extend(row(s) for s in tail)


def rank_title(r: RankAnalysis) -> str:
    """Rank, file, host (left out when the trace does not name it: jax.profiler traces), device, domain."""
    who = f"rank {r.rank}" if r.rank is not None else "trace"
    host = f"  host={r.host}" if r.host else ""
    return f"{who}  {Path(r.path).name}{host}  device={r.device_name or 'none'}  domain={r.domain}"


def breakdown_table(r: RankAnalysis) -> Table:
    # an always-zero category gives way first; then the ones that hold the least time
    totals = r.totals()
    order = sorted(CATEGORIES, key=lambda c: totals[f"{c}_us"])
    cols = [Column("step", numeric=False), Column("step ms")]
    cols += [Column(SHORT_LABELS[c], priority=(0 if totals[f"{c}_us"] == 0 else 10 + order.index(c)))
             for c in CATEGORIES]
    t = Table("step breakdown, ms (the six pieces sum to the step time)", cols)
    _step_rows(t, r.steps, lambda s: [str(s.step if s.step is not None else "all"), _ms(s.dur_us),
                                      *[_ms(s.us(c)) for c in CATEGORIES]])
    if len(r.steps) > 1:
        t.bold_rows.add(len(t.rows))
        t.rows.append(["total", _ms(totals["step_us"]), *[_ms(totals[f"{c}_us"]) for c in CATEGORIES]])
    if totals["step_us"] > 0:
        t.rows.append(["share", "100%", *[f"{100 * totals[f'{c}_us'] / totals['step_us']:.1f}%" for c in CATEGORIES]])
    return t


def kernel_tables(r: RankAnalysis, top: int) -> list[Table]:
    device = r.domain == "device"
    out = []
    seen: list[list[str]] = []
    for label, rows in (("kernel families" if device else "CPU operator families", r.kernels.families),
                        ("kernels" if device else "top-level CPU operators", r.kernels.kernels)):
        names = [k.name for k in rows[:top]]
        if names in seen:  # a CPU trace's operators are their own families: one table, not the same twice
            continue
        seen.append(names)
        cols = [Column("name", numeric=False), Column("class", numeric=False, priority=1), Column("count", priority=5),
                Column("total ms"), Column("share", priority=8), Column("mean us", priority=3),
                Column("median us", priority=6), Column("p90 us", priority=4)]
        t = Table(f"top {label} by total time", cols)
        for k in rows[:top]:
            t.rows.append([k.name, k.cls, str(k.count), _ms(k.total_us), f"{100 * k.share:.1f}%", f"{k.mean_us:.1f}",
                           f"{k.median_us:.1f}", f"{k.p90_us:.1f}"])
        out.append(t)
    return out


def roofline_table(r: RankAnalysis, top: int) -> Table | None:
    if not r.kernels.roofline:
        return None
    cols = [Column("op", numeric=False), Column("shapes", priority=1),  # shapes are numbers: shown whole or not
            Column("dtype", numeric=False, priority=2), Column("count", priority=3), Column("median us"),
            Column("GFLOP", priority=5), Column("MB", priority=4), Column("FLOP/B", priority=6), Column("TFLOP/s"),
            Column("% of roof"), Column("bound", numeric=False, priority=7)]
    t = Table(f"roofline ({r.kernels.gpu or 'no device: FLOPs and bytes only'})", cols)
    for p in r.kernels.roofline[:top]:
        t.rows.append([p.op, p.shapes[:40], p.dtype, str(p.count), f"{p.median_us:.1f}", f"{p.flops / 1e9:.3f}",
                       f"{p.bytes_moved / 1e6:.3f}", f"{p.intensity:.1f}", f"{p.achieved_tflops:.3g}",
                       "-" if p.pct_of_roof is None else f"{p.pct_of_roof:.3g}", p.bound or "-"])
    return t


def launch_lines(r: RankAnalysis) -> list[str]:
    ls = r.launch
    if ls is None:
        return []
    d, o = ls.delay_us, ls.op_delay_us
    short = (f"short kernels (< {ls.short_us:g} us): {ls.n_short}/{ls.n_kernels} ({100 * ls.short_count_fraction:.1f}% "
             f"of kernels, {100 * ls.short_time_fraction:.1f}% of kernel time); unlinked device events: "
             f"{ls.unlinked_device_events}")
    if d.n == 0:  # no launch records (a jax.profiler trace): nothing to say about launches
        return [short]
    lines = [f"launch delay (runtime call start -> first device start, {d.n} launches): median {d.p50:.1f} us, "
             f"p90 {d.p90:.1f} us, p99 {d.p99:.1f} us, max {d.max:.1f} us; {ls.n_graph_launches} graph launch(es) "
             f"running {ls.graph_kernels} kernel(s)",
             f"CPU op start -> its first device start ({o.n} op calls): median {o.p50:.1f} us, p90 {o.p90:.1f} us, "
             f"max {o.max:.1f} us", short]
    if ls.per_step:
        mean_launch = sum(s.launch_cpu_us for s in ls.per_step) / len(ls.per_step)
        mean_sync = sum(s.sync_cpu_us for s in ls.per_step) / len(ls.per_step)
        lines.append(f"CPU time per step in launch APIs: {mean_launch:,.1f} us (mean), in sync APIs: "
                     f"{mean_sync:,.1f} us")
    return lines


def hta_table(ranks: list[RankAnalysis]) -> Table | None:
    rows = [(r, r.hta) for r in ranks if r.hta]
    if not rows:
        return None
    keys = ("kernel_time_us", "idle_time_us", "compute_time_us", "non_compute_time_us")
    cols = [Column("rank", numeric=False), *[Column(k.removesuffix("_us").replace("_", " ") + " ms") for k in keys],
            Column("comm/comp overlap %")]
    t = Table("HTA 0.5.0 definitions (temporal breakdown, comm/comp overlap) on this analysis", cols)
    for r, h in rows:
        pct = h["comp_comm_overlap_pctg"]
        t.rows.append([str(r.rank if r.rank is not None else "-"), *[_ms(h[k]) for k in keys],
                       "-" if pct is None else f"{pct:.2f}"])
    return t


def multirank_blocks(mr: MultiRankReport) -> list[Block]:
    residual = "" if mr.alignment_residual_us is None else \
        f"; residual spread of aligned collective ends {mr.alignment_residual_us:,.1f} us"
    out = [Block("rule", "multi-rank"),
           Block("line", f"clock alignment: {mr.alignment}{residual}"),
           Block("line", f"collectives matched by {mr.matching}: {mr.n_matched_collectives}")]
    out += [Block("warning", w) for w in mr.warnings]
    t = Table("step time per rank (ms)", [Column("step", numeric=False), *[Column(f"rank {r}") for r in mr.ranks],
                                          Column("skew ms"), Column("slowest")])
    _step_rows(t, mr.steps, lambda s: [str(s.step if s.step is not None else "all"),
                                       *[_ms(s.dur_us_by_rank[r]) for r in mr.ranks], _ms(s.skew_us),
                                       str(s.slowest_rank)])
    w = Table("time waiting in collectives for the last rank to arrive (ms)",
              [Column("rank", numeric=False), Column("total"), Column("entered last (times)")])
    for rank in mr.ranks:
        w.rows.append([str(rank), _ms(mr.wait_total_us[rank]), str(mr.last_arrivals[rank])])
    return [*out, Block("table", table=t), Block("table", table=w)]


def blocks(result: TraceAnalysis, top: int) -> list[Block]:
    """Everything ``wavefront trace analyze`` prints, in order."""
    out = [Block("warning", w) for w in result.warnings]
    for r in result.ranks:
        out.append(Block("rule", rank_title(r)))
        out += [Block("warning", w) for w in r.warnings] + [Block("note", n) for n in r.notes]
        out.append(Block("table", table=breakdown_table(r)))
        out += [Block("table", table=t) for t in kernel_tables(r, top)]
        roof = roofline_table(r, top)
        if roof is not None:
            out.append(Block("table", table=roof))
        if r.domain == "device":
            out += [Block("note", n) for n in r.kernels.notes]
        out += [Block("line", line) for line in launch_lines(r)]
    hta = hta_table(result.ranks)
    if hta is not None:
        out.append(Block("table", table=hta))
    if result.multirank is not None:
        out += multirank_blocks(result.multirank)
    return out


def diff_table(result: TraceDiff) -> Table:
    cols = [Column("kind", numeric=False, priority=2), Column("quantity", numeric=False), Column("median A ms"),
            Column("median B ms"), Column("ratio"), Column("95% CI", priority=3), Column("p", priority=1),
            Column("verdict", numeric=False), Column("note", numeric=False, priority=0)]
    t = Table(f"B vs A per step ({result.n_steps_a} steps in A, {result.n_steps_b} in B; ratio = median B / median A)",
              cols)
    for r in result.rows:
        t.rows.append([r.kind, r.key, _ms(r.median_a_us), _ms(r.median_b_us),
                       "-" if r.ratio is None else f"{r.ratio:.3f}",
                       "-" if r.ci_low is None else f"[{r.ci_low:.3f}, {r.ci_high:.3f}]",
                       "-" if r.p_value is None else f"{r.p_value:.2g}", r.verdict, r.note or ""])
    return t
