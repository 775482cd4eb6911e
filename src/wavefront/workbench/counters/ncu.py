"""Nsight Compute: ``ncu --csv --page raw`` exports, and ``.ncu-rep`` reports through NVIDIA's ``ncu_report``.

The CSV (written against Nsight Compute 2025.1; the raw page's layout has been stable since 2020.x): a header
row of column names (``"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",
"Block Size","Grid Size","Device","CC"``, then one column per metric), a units row (empty for the launch
columns; ``byte``/``Kbyte``/``Mbyte``/``Gbyte`` (decimal), ``nsecond``/``usecond``/``msecond``/``second``,
``%``, ``inst``, ...), then one row per profiled kernel launch. ``==PROF==`` lines that ncu prints around it
are skipped. Derived quantities follow NVIDIA's own roofline sections (the Kernel Profiling Guide, the
``SpeedOfLight_*RooflineChart`` section files):

    tensor FLOP = sm__inst_executed_pipe_tensor.sum x 512              (the hierarchical tensor roofline's factor)
    vector FLOP = 2 x ffma + fadd + fmul  +  2 x hfma + hadd + hmul     (smsp/sm__sass_thread_inst_executed_op_
                                                                         <op>_pred_on.sum: thread instructions)
    DRAM bytes  = dram__bytes_read.sum + dram__bytes_write.sum          (or dram__bytes.sum)
    L2 bytes    = lts__t_bytes.sum;  L1 bytes = l1tex__t_bytes.sum
    occupancy   = sm__warps_active.avg.pct_of_peak_sustained_active / 100
    registers   = launch__registers_per_thread
    shared      = launch__shared_mem_per_block_static + launch__shared_mem_per_block_dynamic
    stalls      = smsp__average_warp_latency_issue_stalled_<reason>.ratio (cycles per issued instruction), or
                  smsp__pcsamp_warps_issue_stalled_<reason> (samples)
"""

from __future__ import annotations

import csv
import io
import re

from wavefront.workbench.counters.model import CountersLoadError, Launch, Profile, number

FORMAT = "ncu --csv --page raw (written against Nsight Compute 2025.1)"
LAUNCH_COLUMNS = ("ID", "Kernel Name", "Block Size", "Grid Size")
DURATION = "gpu__time_duration.sum"

_SCALE = {
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
    "nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
    "%": 0.01,
}
_BYTES = {"byte", "Kbyte", "Mbyte", "Gbyte", "Tbyte"}
_TIME = {"nsecond", "usecond", "msecond", "second"}
_STALL = re.compile(r"^smsp__(average_warp_latency|pcsamp_warps)_issue_stalled_(\w+?)(?:\.(ratio|sum))?$")


def is_ncu_header(header: list[str]) -> bool:
    return all(c in header for c in LAUNCH_COLUMNS)


def _base(value: float, unit: str, column: str, path: str, family: set[str] | None) -> float:
    head = unit.split("/")[0]  # "byte/block" counts bytes; "register/thread" is a plain count
    if family is not None and head not in family:
        raise CountersLoadError(f"{path}: metric {column} in unit {unit!r}; expected one of {sorted(family)}")
    return value * _SCALE.get(head, 1.0)


def _dims(text: str) -> tuple[int, ...] | None:
    nums = [int(n) for n in re.findall(r"\d+", text.replace(",", " , "))]
    return tuple(nums) if nums else None


def _product(dims: tuple[int, ...] | None) -> int | None:
    if not dims:
        return None
    out = 1
    for d in dims:
        out *= d
    return out


def _sum(metrics: dict[str, float], *names: str, weights: tuple[float, ...] | None = None) -> float | None:
    """Weighted sum of the metrics present; None when none of them was measured."""
    present = [(n, w) for n, w in zip(names, weights or (1.0,) * len(names), strict=True) if n in metrics]
    return sum(metrics[n] * w for n, w in present) if present else None


def _sass(metrics: dict[str, float], op: str) -> str:
    for prefix in ("smsp", "sm"):
        name = f"{prefix}__sass_thread_inst_executed_op_{op}_pred_on.sum"
        if name in metrics:
            return name
    return f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum"


def launch_from_metrics(metrics: dict[str, float], *, launch_id: int, kernel: str, grid: tuple[int, ...] | None,
                        block: tuple[int, ...] | None) -> Launch:
    """A Launch from base-unit metrics (shared by the CSV and the ncu_report paths)."""
    m = metrics
    vector = _sum(m, *(_sass(m, op) for op in ("ffma", "fadd", "fmul", "hfma", "hadd", "hmul")),
                  weights=(2.0, 1.0, 1.0, 2.0, 1.0, 1.0))
    tensor = m.get("sm__inst_executed_pipe_tensor.sum")
    dram = (_sum(m, "dram__bytes_read.sum", "dram__bytes_write.sum")
            if "dram__bytes_read.sum" in m or "dram__bytes_write.sum" in m else m.get("dram__bytes.sum"))
    occ = m.get("sm__warps_active.avg.pct_of_peak_sustained_active")
    regs = m.get("launch__registers_per_thread")
    shared = _sum(m, "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic")
    stalls: dict[str, float] = {}
    unit = ""
    for name, value in m.items():
        hit = _STALL.match(name)
        if hit and not hit.group(2).endswith("_not_issued"):
            stalls[hit.group(2)] = value
            unit = "cycles per issued instruction" if hit.group(1) == "average_warp_latency" else "samples"
    return Launch("ncu", launch_id, kernel, _product(grid), grid, _product(block), m.get(DURATION),
                  tensor * 512.0 if tensor is not None else None, vector, dram, m.get("lts__t_bytes.sum"),
                  m.get("l1tex__t_bytes.sum"), None, occ, int(regs) if regs is not None else None,
                  int(shared) if shared is not None else None,
                  dict(sorted(stalls.items(), key=lambda kv: -kv[1])), unit, dict(m))


_FAMILIES = {DURATION: _TIME, "dram__bytes_read.sum": _BYTES, "dram__bytes_write.sum": _BYTES,
             "dram__bytes.sum": _BYTES, "lts__t_bytes.sum": _BYTES, "l1tex__t_bytes.sum": _BYTES,
             "sm__warps_active.avg.pct_of_peak_sustained_active": {"%"},
             "launch__shared_mem_per_block_static": _BYTES, "launch__shared_mem_per_block_dynamic": _BYTES}


def read_csv(text: str, path: str) -> Profile:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header = rows[0]
    if DURATION not in header:
        raise CountersLoadError(f"{path}: Nsight Compute CSV without the {DURATION} column; profile with it "
                                "(ncu --section SpeedOfLight, or --metrics gpu__time_duration.sum,...)")
    if len(rows) < 3:
        raise CountersLoadError(f"{path}: Nsight Compute CSV with no kernel rows; expected a units row, then one "
                                "row per launch (ncu --csv --page raw)")
    units, data = rows[1], rows[2:]
    if units[header.index(DURATION)] not in _TIME:
        raise CountersLoadError(f"{path}: the second row is not ncu's units row (the {DURATION} unit is "
                                f"{units[header.index(DURATION)]!r}); export with ncu --csv --page raw")
    # Metric names are `<unit>__<counter>...`; launch columns ("ID", "Kernel Name", ...) have no "__", so a
    # version that adds launch columns still reads.
    metric_cols = [j for j, name in enumerate(header) if "__" in name]
    device_col = header.index("device__attribute_display_name") if "device__attribute_display_name" in header \
        else None
    launches = []
    for i, row in enumerate(data, start=3):
        if len(row) != len(header):
            raise CountersLoadError(f"{path}: row {i} has {len(row)} fields, the header {len(header)} "
                                    "(a truncated file?)")
        cell = dict(zip(header, row, strict=True))
        metrics = {}
        for j in metric_cols:
            col = header[j]
            if j == device_col:
                continue
            value = number(row[j], path, f"row {i}, {col}")
            if value is not None:
                metrics[col] = _base(value, units[j], col, path, _FAMILIES.get(col))
        launch_id = number(cell["ID"], path, f"row {i}, ID")
        launches.append(launch_from_metrics(metrics, launch_id=int(launch_id or 0), kernel=cell["Kernel Name"],
                                            grid=_dims(cell["Grid Size"]), block=_dims(cell["Block Size"])))
    device = data[0][device_col] if device_col is not None and data else None
    return Profile(path, "ncu", FORMAT, launches, device)


def read_report(path: str) -> Profile:
    """A binary ``.ncu-rep`` through ``ncu_report`` (ships with Nsight Compute in extras/python, not on PyPI)."""
    try:
        import ncu_report  # lazy: optional ncu_report
    except ImportError:
        raise CountersLoadError(
            f"{path}: a binary file (an Nsight Compute .ncu-rep?) and NVIDIA's ncu_report module is not "
            "importable; add <nsight-compute>/extras/python to PYTHONPATH, or export CSV: "
            f"ncu --import {path} --csv --page raw > {path}.csv") from None
    try:
        ctx = ncu_report.load_report(path)
    except Exception as exc:  # the module's own errors: a foreign or damaged file
        raise CountersLoadError(f"{path}: ncu_report cannot load it as an Nsight Compute report: {exc}") from None
    launches: list[Launch] = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            metrics = {}
            for name in action.metric_names():
                metric = action.metric_by_name(name)
                try:
                    value = float(metric.as_double())
                except (TypeError, ValueError):
                    continue  # string-valued metrics (names, attributes)
                metrics[name] = _base(value, metric.unit() or "", name, path, _FAMILIES.get(name))
            if DURATION not in metrics:
                raise CountersLoadError(f"{path}: launch {action.name()} has no {DURATION}; profile with it")
            grid = (int(metrics["launch__grid_size"]),) if "launch__grid_size" in metrics else None
            block = (int(metrics["launch__block_size"]),) if "launch__block_size" in metrics else None
            launches.append(launch_from_metrics(metrics, launch_id=len(launches), kernel=action.name(),
                                                grid=grid, block=block))
    return Profile(path, "ncu", "Nsight Compute report (.ncu-rep) via ncu_report", launches)
