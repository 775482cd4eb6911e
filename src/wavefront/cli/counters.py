"""`wavefront counters PROFILE [PROFILE_B]`: hardware counters of a vendor profile on the device roofline,
beside inspect and traffic predictions; with two profiles, A/B per kernel and metric (the jobs are
wavefront.workbench.jobs.counters.counters and .compare)."""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._common import command, write_json
from wavefront.cli._output import JsonOut, console, err_console, fail, table
from wavefront.workbench.counters.model import CountersLoadError
from wavefront.workbench.jobs import counters as job
from wavefront.workbench.jobs.request import RequestError


def _num(x, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _gb(x) -> str:
    return "-" if x is None else f"{x / 1e9:.3g} GB"


def _kernel_table(doc: dict):
    rows = []
    for k in doc["kernels"]:
        p = k["predicted"]
        match = f"{p['op']}/{p['mode']}/{p['case']}" if p["op"] else (p["source"] or "not wavefront's")
        rows.append([str(k["launch_id"]), k["kernel"], f"{k['n_blocks']} x {k['threads_per_block']}",
                     _num(k["duration_us"]), _num(k["achieved_tflops"]), _num(k["intensity_dram"]),
                     _num(k["pct_of_roof"], ".0f"), k["bound"] or "-", _gb(k["dram_bytes"]), _gb(p["bytes"]),
                     f"{_num(k['achieved_occupancy'], '.2f')} / {_num(p['occupancy'], '.2f')}",
                     f"{_num(k['registers'], 'd')} / {_num(p['regs'], 'd')}", match])
    return table(f"{doc['profile']} on {doc['device_name']} ({doc['tool']})",
                 ["#", "kernel", "grid", "us", "TFLOP/s", "FLOP/B", "% roof", "bound", "DRAM", "predicted",
                  "occ meas/pred", "regs meas/pred", "matched"], rows,
                 numeric=["#", "us", "TFLOP/s", "FLOP/B", "% roof", "DRAM", "predicted", "occ meas/pred",
                          "regs meas/pred"], droppable=["matched", "grid", "bound"])


def _compare_table(doc: dict):
    rows = []
    for d in doc["deltas"]:
        if d["method"] == "stats":
            how = f"[{d['ci_low']:.3f}, {d['ci_high']:.3f}] p={d['p_value']:.2g} {d['verdict']}"
        elif d["method"] == "delta":
            how = f"delta only (n={d['n_a']}/{d['n_b']})"
        else:
            how = "not measured"
        rows.append([f"{d['kernel']} [{d['n_blocks']} x {d['threads_per_block']}]", d["metric"],
                     _num(d["median_a"], ".4g"), _num(d["median_b"], ".4g"), _num(d["ratio"], ".3f"), how])
    return table(f"A = {doc['a']} vs B = {doc['b']}", ["kernel", "metric", "median A", "median B", "B/A",
                                                      "95% CI, p, verdict"], rows,
                 numeric=["median A", "median B", "B/A"])


def _run(call, request):
    try:
        return call(request)
    except RequestError as exc:
        fail(f"--{exc.argument}: {exc.message}")
    except CountersLoadError as exc:
        fail(str(exc))


def counters(
    profile: Annotated[str, typer.Argument(help="A profile: Nsight Compute .ncu-rep or `ncu --csv --page raw` "
                                                "export, rocprofv3 counter_collection.csv, rocprof-compute "
                                                "pmc_perf.csv (recognised by content).")],
    profile_b: Annotated[str | None, typer.Argument(help="A second profile: compare B against A per kernel "
                                                         "and metric.")] = None,
    device: Annotated[str | None, typer.Option(help="Device-table name (h100, mi300x); default: the device "
                                                    "the profile names.")] = None,
    inspect: Annotated[str | None, typer.Option(help="A `wavefront inspect --json` document: predicted "
                                                     "registers, spills, occupancy.")] = None,
    traffic: Annotated[str | None, typer.Option(help="A `wavefront traffic --json` document: predicted "
                                                     "bytes.")] = None,
    json_out: JsonOut = None,
) -> None:
    """Per launch: duration, FLOP/s per pipe, DRAM/L2/L1 bytes, occupancy, stalls, registers, placed on the
    device roofline and matched to wavefront's kernels; gaps to the predictions called out. With two
    profiles: per kernel and metric, the `compare` statistics where launches repeat (5+), else a plain delta."""
    show = json_out != "-"
    if profile_b is not None:
        if inspect or traffic:
            fail("--inspect/--traffic apply to one profile; drop them to compare two")
        result = _run(job.compare, job.CompareRequest(profile, profile_b, device))
        doc = result.as_dict()
        if show:
            console.print(_compare_table(doc))
            for side, names in (("A", doc["only_a"]), ("B", doc["only_b"])):
                if names:
                    console.print(f"[dim]only in {side}: {', '.join(names)}[/]", soft_wrap=True, highlight=False)
    else:
        result = _run(job.counters, job.CountersRequest(profile, device, inspect, traffic))
        doc = result.as_dict()
        if show:
            console.print(_kernel_table(doc))
            for n in doc["notes"]:
                console.print(f"[dim]{n}[/]", soft_wrap=True, highlight=False)
            for k in doc["kernels"]:
                for gap in k["gaps"]:
                    err_console.print(f"[yellow]gap:[/] {k['kernel']} #{k['launch_id']}: {gap}", soft_wrap=True,
                                      highlight=False)
    if json_out:
        write_json(doc, json_out)


def register(app: typer.Typer) -> None:
    command(app, "counters")(counters)
