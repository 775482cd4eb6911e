"""AMD counters: rocprofv3 ``--pmc`` counter collection and rocprof-compute (Omniperf) ``pmc_perf.csv``.

``counter_collection.csv`` (rocprofv3, written against ROCm 6.4/7.0): one row per counter per dispatch,
columns ``Correlation_Id, Dispatch_Id, Agent_Id, Queue_Id, Process_Id, Thread_Id, Grid_Size, Kernel_Id,
Kernel_Name, Workgroup_Size, LDS_Block_Size, Scratch_Size, VGPR_Count, Accum_VGPR_Count, SGPR_Count,
Counter_Name, Counter_Value, Start_Timestamp, End_Timestamp``. ``pmc_perf.csv`` (rocprof-compute 3.x): one
row per dispatch, ``Dispatch_ID, Kernel_Name, GPU_ID, Grid_Size, Workgroup_Size, LDS_Per_Workgroup,
Scratch_Per_Workitem, Arch_VGPR, Accum_VGPR, SGPR, Wave_Size, Start_Timestamp, End_Timestamp``, then one
column per counter. ``Grid_Size`` counts work-items, so workgroups = Grid_Size / Workgroup_Size.

Derived quantities by rocprof-compute's roofline and memory-chart definitions (its docs, "Performance
model"; the MI200/MI300 forms with 64-byte L2 lines and 32 LDS banks of 4 bytes):

    MFMA FLOP   = 512 x (SQ_INSTS_VALU_MFMA_MOPS_F16 + _BF16 + _F32 + _F64)
    VALU FLOP   = 64 x sum over F16, F32, F64 of (ADD + MUL + TRANS + 2 x FMA)   (SQ_INSTS_VALU_<op>_<p>)
    HBM bytes   = 32 x RDREQ_32B + 64 x (RDREQ - RDREQ_32B) + 64 x WRREQ_64B + 32 x (WRREQ - WRREQ_64B)
                  (TCC_EA0_<counter>_sum; TCC_EA_<counter>_sum in older collections)
    L2 bytes    = 64 x (TCP_TCC_READ_REQ_sum + TCP_TCC_WRITE_REQ_sum + TCP_TCC_ATOMIC_WITH_RET_REQ_sum
                        + TCP_TCC_ATOMIC_WITHOUT_RET_REQ_sum)
    vL1D bytes  = 64 x TCP_TOTAL_CACHE_ACCESSES_sum
    LDS bytes   = 128 x (SQ_LDS_IDX_ACTIVE - SQ_LDS_BANK_CONFLICT)
    waves / CU  = SQ_ACCUM_PREV_HIRES / GRBM_GUI_ACTIVE / CUs  (kept as "mean_waves_per_cu_x_cus"; the
                  occupancy fraction needs the device's CU count and waves per SIMD, see analysis)
    registers   = VGPR_Count + Accum_VGPR_Count (AGPRs included, as inspect counts them on CDNA)
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict

from wavefront.workbench.counters.model import CountersLoadError, Launch, Profile, number

V3_FORMAT = "rocprofv3 --pmc counter_collection.csv (written against ROCm 6.4/7.0)"
PERF_FORMAT = "rocprof-compute pmc_perf.csv (written against rocprof-compute 3.x)"
V3_COLUMNS = ("Dispatch_Id", "Kernel_Name", "Grid_Size", "Workgroup_Size", "Counter_Name", "Counter_Value",
              "Start_Timestamp", "End_Timestamp")
PERF_COLUMNS = ("Dispatch_ID", "Kernel_Name", "Grid_Size", "Workgroup_Size", "Start_Timestamp", "End_Timestamp")
#: pmc_perf.csv's per-dispatch columns that are not counters.
_PERF_INFO = {"Dispatch_ID", "Kernel_Name", "GPU_ID", "Queue_ID", "PID", "TID", "Grid_Size", "Workgroup_Size",
              "LDS_Per_Workgroup", "Scratch_Per_Workitem", "Arch_VGPR", "Accum_VGPR", "SGPR", "Wave_Size",
              "Start_Timestamp", "End_Timestamp", "Correlation_ID", "Node", "Kernel_ID"}
WAVES_X_CUS = "mean_waves_per_cu_x_cus"


def is_v3_header(header: list[str]) -> bool:
    return all(c in header for c in V3_COLUMNS)


def is_perf_header(header: list[str]) -> bool:
    return all(c in header for c in PERF_COLUMNS)


def _all(c: dict[str, float], *names: str) -> bool:
    return all(n in c for n in names)


def _tcc(c: dict[str, float], name: str) -> str:
    return f"TCC_EA0_{name}_sum" if f"TCC_EA0_{name}_sum" in c else f"TCC_EA_{name}_sum"


def derive(c: dict[str, float]) -> dict[str, float | None]:
    """The derived quantities of the module docstring; None where a counter they need is missing."""
    mfma = [f"SQ_INSTS_VALU_MFMA_MOPS_{p}" for p in ("F16", "BF16", "F32", "F64")]
    valu = {f"SQ_INSTS_VALU_{op}_{p}": (2.0 if op == "FMA" else 1.0)
            for p in ("F16", "F32", "F64") for op in ("ADD", "MUL", "TRANS", "FMA")}
    rd, rd32, wr, wr64 = (_tcc(c, n) for n in ("RDREQ", "RDREQ_32B", "WRREQ", "WRREQ_64B"))
    l2 = ("TCP_TCC_READ_REQ_sum", "TCP_TCC_WRITE_REQ_sum", "TCP_TCC_ATOMIC_WITH_RET_REQ_sum",
          "TCP_TCC_ATOMIC_WITHOUT_RET_REQ_sum")
    return {
        "tensor_flops": 512.0 * sum(c[n] for n in mfma if n in c) if any(n in c for n in mfma) else None,
        "vector_flops": 64.0 * sum(c[n] * w for n, w in valu.items() if n in c) if any(n in c for n in valu)
        else None,
        "dram_bytes": 32 * c[rd32] + 64 * (c[rd] - c[rd32]) + 64 * c[wr64] + 32 * (c[wr] - c[wr64])
        if _all(c, rd, rd32, wr, wr64) else None,
        "l2_bytes": 64.0 * sum(c[n] for n in l2) if _all(c, *l2) else None,
        "l1_bytes": 64.0 * c["TCP_TOTAL_CACHE_ACCESSES_sum"] if "TCP_TOTAL_CACHE_ACCESSES_sum" in c else None,
        "lds_bytes": 128.0 * (c["SQ_LDS_IDX_ACTIVE"] - c["SQ_LDS_BANK_CONFLICT"])
        if _all(c, "SQ_LDS_IDX_ACTIVE", "SQ_LDS_BANK_CONFLICT") else None,
        WAVES_X_CUS: c["SQ_ACCUM_PREV_HIRES"] / c["GRBM_GUI_ACTIVE"]
        if _all(c, "SQ_ACCUM_PREV_HIRES", "GRBM_GUI_ACTIVE") and c["GRBM_GUI_ACTIVE"] > 0 else None,
    }


def _ns(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _launch(tool: str, dispatch: int, info: dict[str, str], counters: dict[str, float], path: str, where: str,
            names: dict[str, str]) -> Launch:
    def num(key: str) -> float | None:
        return number(info.get(names[key], ""), path, f"{where}, {names[key]}") if names[key] in info else None

    grid, wg = num("grid"), num("wg")
    start, end = _ns(info.get(names["start"], "")), _ns(info.get(names["end"], ""))  # integers: at 1.7e18 ns
    if start is None or end is None or end < start:  # a float64 is 256 ns coarse
        raise CountersLoadError(f"{path}: {where}: Start_Timestamp/End_Timestamp missing or reversed")
    vgpr, agpr, lds = num("vgpr"), num("agpr"), num("lds")
    d = derive(counters)
    metrics = dict(counters)
    if d[WAVES_X_CUS] is not None:
        metrics[WAVES_X_CUS] = d[WAVES_X_CUS]  # type: ignore[assignment]
    n_blocks = int(round(grid / wg)) if grid and wg else None
    return Launch(tool, dispatch, info[names["kernel"]], n_blocks, None, int(wg) if wg else None, float(end - start),
                  d["tensor_flops"], d["vector_flops"], d["dram_bytes"], d["l2_bytes"], d["l1_bytes"],
                  d["lds_bytes"], None, int(vgpr + (agpr or 0)) if vgpr is not None else None,
                  int(lds) if lds is not None else None, {}, "", metrics)


_V3_NAMES = {"kernel": "Kernel_Name", "grid": "Grid_Size", "wg": "Workgroup_Size", "start": "Start_Timestamp",
             "end": "End_Timestamp", "vgpr": "VGPR_Count", "agpr": "Accum_VGPR_Count", "lds": "LDS_Block_Size"}
_PERF_NAMES = {"kernel": "Kernel_Name", "grid": "Grid_Size", "wg": "Workgroup_Size", "start": "Start_Timestamp",
               "end": "End_Timestamp", "vgpr": "Arch_VGPR", "agpr": "Accum_VGPR", "lds": "LDS_Per_Workgroup"}


def _rows(text: str) -> list[dict[str, str]]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    out = []
    for row in reader:
        if not row:
            continue
        out.append(dict(zip(header, row, strict=False)) | {"__n": str(len(row)), "__want": str(len(header))})
    return out


def _check(row: dict[str, str], path: str, line: int) -> None:
    if row["__n"] != row["__want"]:
        raise CountersLoadError(f"{path}: line {line} has {row['__n']} fields, the header {row['__want']} "
                                "(a truncated file?)")


def read_v3(text: str, path: str) -> Profile:
    info: dict[int, dict[str, str]] = {}
    counters: dict[int, dict[str, float]] = defaultdict(dict)
    for line, row in enumerate(_rows(text), start=2):
        _check(row, path, line)
        dispatch = int(number(row["Dispatch_Id"], path, f"line {line}, Dispatch_Id") or 0)
        info.setdefault(dispatch, row)
        value = number(row["Counter_Value"], path, f"line {line}, Counter_Value")
        if value is not None:  # summed: rocprofv3 writes one row per dimension instance unless aggregated
            c = counters[dispatch]
            c[row["Counter_Name"]] = c.get(row["Counter_Name"], 0.0) + value
    if not info:
        raise CountersLoadError(f"{path}: rocprofv3 counter collection with no rows")
    launches = [_launch("rocprofv3", d, info[d], counters[d], path, f"dispatch {d}", _V3_NAMES) for d in sorted(info)]
    return Profile(path, "rocprofv3", V3_FORMAT, launches)


def read_perf(text: str, path: str) -> Profile:
    launches = []
    for line, row in enumerate(_rows(text), start=2):
        _check(row, path, line)
        counters = {}
        for k, v in row.items():
            if k in _PERF_INFO or k.startswith("__"):
                continue
            value = number(v, path, f"line {line}, {k}")
            if value is not None:
                counters[k] = value
        dispatch = int(number(row["Dispatch_ID"], path, f"line {line}, Dispatch_ID") or 0)
        launches.append(_launch("rocprof-compute", dispatch, row, counters, path, f"line {line}", _PERF_NAMES))
    if not launches:
        raise CountersLoadError(f"{path}: rocprof-compute pmc_perf.csv with no dispatch rows")
    return Profile(path, "rocprof-compute", PERF_FORMAT, launches)
