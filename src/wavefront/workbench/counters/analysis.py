"""Each measured launch on the device's roofline, beside what ``inspect`` and ``traffic`` predicted.

Roofline (the device table's dense peaks, :mod:`wavefront.workbench.hardware`, as ``wavefront roofline``
uses them): FLOP = tensor + vector FLOPs measured; the roof is the matrix peak (BF16/FP16) when the launch
issued tensor/MFMA work, else the FP32 vector peak; ``intensity_dram = FLOP / DRAM bytes``;
``attainable = min(peak, intensity_dram x HBM bandwidth)``; ``pct_of_roof = achieved / attainable``;
``bound`` is "memory" left of the ridge (peak / HBM bandwidth), else "compute". The hierarchical part gives
the same FLOPs per L2 and per L1 byte (``intensity_l2``, ``intensity_l1``); their roofs are not drawn: the
device table holds no sourced L2 or L1 bandwidth.

Matching: a launch matches an ``inspect`` row (compiled for the device's target) whose kernel has the same
function name and whose grid (blocks) and threads per block equal the launch's ("name+shape"); failing the
shape, a name-only match is kept and labelled. ``traffic`` rows are CPU-interpreter counts at their own
shapes: the bytes of a launch with the same grid are compared as they are ("same grid"), otherwise scaled by
the ratio of blocks ("scaled per block", exact only for kernels whose blocks each move the same bytes).

Gaps called out: measured DRAM bytes outside [1/2, 2] x the predicted bytes (:data:`BYTES_GAP`; below the
prediction usually means L2 hits, above it re-reads or spills), achieved occupancy below half the predicted
(:data:`OCCUPANCY_GAP`), registers that differ from inspect's (a different compilation was profiled), and,
with the same registers, the profiler's theoretical occupancy more than :data:`THEORETICAL_TOL` from
inspect's (the two model the same quantity; a difference is an error in the occupancy model).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wavefront
from wavefront.workbench.counters.model import Launch, Profile, short_name
from wavefront.workbench.counters.rocprof import WAVES_X_CUS
from wavefront.workbench.hardware import GPU

BYTES_GAP = 2.0
OCCUPANCY_GAP = 0.5
THEORETICAL_TOL = 0.02  # about one warp of 64 per SM: inspect and ncu model the same thing, so they agree
TOP_STALLS = 3


_JIT = re.compile(r"^@(?:triton|gluon)\.jit\b[^\n]*\n(?:@[^\n]*\n)*def (\w+)", re.M)


@functools.cache
def wavefront_kernels() -> dict[str, str]:
    """Name -> source file of every jitted function under wavefront/kernels (read, not imported: this package
    stays torch- and Triton-free). Helpers inlined into kernels are listed too; they never appear as launches."""
    root = Path(wavefront.__file__).parent / "kernels"
    out: dict[str, str] = {}
    for f in sorted(root.glob("*.py")):
        for name in _JIT.findall(f.read_text()):
            out.setdefault(name, f"kernels/{f.name}")
    return out


@dataclass
class Prediction:
    source: str | None = None  # the wavefront kernel file defining a kernel of this name; None: not ours
    op: str | None = None
    mode: str | None = None
    case: str | None = None
    inspect_match: str = "none"  # "name+shape" | "name" | "ambiguous:<n>" | "none"
    regs: int | None = None
    spill_bytes: int | None = None
    occupancy: float | None = None
    occupancy_limiter: str | None = None
    shared_bytes: int | None = None
    traffic_match: str = "none"  # "same grid" | "scaled per block" | "none"
    bytes: float | None = None
    dram_over_predicted: float | None = None


@dataclass
class KernelRow:
    launch_id: int
    kernel: str
    n_blocks: int | None
    threads_per_block: int | None
    duration_us: float | None
    flops: float | None
    tensor_tflops: float | None  # achieved, per pipe
    vector_tflops: float | None
    dram_bytes: float | None
    l2_bytes: float | None
    l1_bytes: float | None
    lds_bytes: float | None
    dram_tbps: float | None
    pct_hbm: float | None
    intensity_dram: float | None
    intensity_l2: float | None
    intensity_l1: float | None
    achieved_tflops: float | None
    roof: str
    peak_tflops: float
    attainable_tflops: float | None
    pct_of_roof: float | None
    bound: str | None
    achieved_occupancy: float | None
    registers: int | None
    shared_bytes: int | None
    top_stalls: list[tuple[str, float]]
    stall_unit: str
    predicted: Prediction = field(default_factory=Prediction)
    gaps: list[str] = field(default_factory=list)
    theoretical_occupancy: float | None = None  # ncu's sm__maximum_warps_per_active_cycle_pct: what inspect models
    occupancy_limiter: str | None = None  # ncu's smallest launch__occupancy_limit_* (inspect's vocabulary)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def occupancy(la: Launch, gpu: GPU) -> float | None:
    """NVIDIA: measured directly. AMD: mean resident waves per CU over the CU count and waves per CU."""
    if la.achieved_occupancy is not None:
        return la.achieved_occupancy
    if WAVES_X_CUS in la.metrics and gpu.vendor == "amd":
        lim = gpu.limits
        return la.metrics[WAVES_X_CUS] / gpu.sm_count / (lim.max_warps_per_sm * lim.simds_per_cu)
    return None


_LIMITS = {"registers": "registers", "shared_mem": "shared", "warps": "warps", "blocks": "blocks"}


def limiter(la: Launch) -> str | None:
    """The resource that caps resident blocks (ncu's launch__occupancy_limit_*), ties joined by '+'."""
    limits = {v: la.metrics[f"launch__occupancy_limit_{k}"] for k, v in _LIMITS.items()
              if f"launch__occupancy_limit_{k}" in la.metrics}
    if not limits:
        return None
    low = min(limits.values())
    return "+".join(k for k, v in limits.items() if v == low)


def place(la: Launch, gpu: GPU) -> KernelRow:
    """One launch on `gpu`'s roofline (see the module docstring)."""
    secs = la.duration_ns * 1e-9 if la.duration_ns else None
    flops = la.flops
    roof = "matrix" if la.tensor_flops else "vector"
    peak = gpu.bf16_tflops if roof == "matrix" else gpu.fp32_tflops
    i_dram = _ratio(flops, la.dram_bytes)
    achieved = flops / secs / 1e12 if flops is not None and secs else None
    attainable = min(peak, i_dram * gpu.hbm_tbps) if i_dram is not None else None
    dram_tbps = la.dram_bytes / secs / 1e12 if la.dram_bytes is not None and secs else None
    row = KernelRow(
        la.launch_id, la.kernel, la.n_blocks, la.threads_per_block, la.duration_ns / 1e3 if la.duration_ns else None,
        flops, la.tensor_flops / secs / 1e12 if la.tensor_flops is not None and secs else None,
        la.vector_flops / secs / 1e12 if la.vector_flops is not None and secs else None,
        la.dram_bytes, la.l2_bytes, la.l1_bytes, la.lds_bytes, dram_tbps,
        dram_tbps / gpu.hbm_tbps * 100 if dram_tbps is not None else None, i_dram, _ratio(flops, la.l2_bytes),
        _ratio(flops, la.l1_bytes), achieved, roof, peak, attainable,
        achieved / attainable * 100 if achieved is not None and attainable else None,
        None if i_dram is None else ("memory" if i_dram < peak / gpu.hbm_tbps else "compute"),
        occupancy(la, gpu), la.registers, la.shared_bytes, list(la.stalls.items())[:TOP_STALLS], la.stall_unit)
    row.theoretical_occupancy = la.metrics.get("sm__maximum_warps_per_active_cycle_pct")
    row.occupancy_limiter = limiter(la)
    return row


def _blocks(grid: Sequence[int] | None) -> int | None:
    if not grid:
        return None
    out = 1
    for g in grid:
        out *= int(g)
    return out


def same_registers(predicted: int | None, measured: int | None, gpu: GPU) -> bool:
    """AMD profilers report the allocated VGPRs (whole granules); inspect reports the count the code uses."""
    if predicted is None or measured is None:
        return True
    if gpu.vendor == "amd":
        unit = gpu.limits.reg_alloc_unit
        predicted = -(-predicted // unit) * unit
    return predicted == measured


def _match_inspect(row: KernelRow, inspect_rows: list[dict[str, Any]], gpu: GPU) -> None:
    name = short_name(row.kernel)
    named = [r for r in inspect_rows if r.get("ok", True) and r.get("target") == gpu.arch
             and short_name(str(r.get("kernel", ""))) == name]
    shaped = [r for r in named if _blocks(r.get("grid")) == row.n_blocks
              and r.get("threads_per_block") == row.threads_per_block]
    pick = shaped or named
    if row.registers is not None:  # the measured registers single out the compilation that ran
        pick = [r for r in pick if same_registers(r.get("regs"), row.registers, gpu)] or pick
    if not pick:
        return
    p, r = row.predicted, pick[0]
    same = {(x.get("regs"), x.get("occupancy"), x.get("spill_bytes")) for x in pick}
    p.inspect_match = ("name+shape" if shaped else "name") if len(same) == 1 else f"ambiguous:{len(pick)}"
    p.op, p.mode, p.case = r.get("op"), r.get("mode"), r.get("case")
    p.regs, p.spill_bytes, p.occupancy, p.shared_bytes = (r.get("regs"), r.get("spill_bytes"), r.get("occupancy"),
                                                          r.get("shared_bytes"))
    p.occupancy_limiter = r.get("occupancy_limiter")


def _match_traffic(row: KernelRow, traffic_rows: list[dict[str, Any]]) -> None:
    name, p = short_name(row.kernel), row.predicted
    found = [(t, k) for t in traffic_rows if not t.get("error") for k in t.get("kernels", [])
             if short_name(str(k.get("kernel", ""))) == name]
    if p.op:  # prefer the op, mode and case inspect matched
        same_op = [f for f in found if (f[0].get("op"), f[0].get("mode")) == (p.op, p.mode)]
        found = [f for f in same_op if f[0].get("case") == p.case] or same_op or found
    if not found:
        return
    exact = [f for f in found if _blocks(f[1].get("grid")) == row.n_blocks]
    t, k = (exact or found)[0]
    moved = float(k.get("loaded_bytes", 0)) + float(k.get("stored_bytes", 0)) + float(k.get("atomic_bytes", 0))
    blocks = _blocks(k.get("grid"))
    if exact:
        p.traffic_match, p.bytes = "same grid", moved
    elif blocks and row.n_blocks:
        p.traffic_match, p.bytes = "scaled per block", moved / blocks * row.n_blocks
    else:
        return
    if p.op is None:
        p.op, p.mode, p.case = t.get("op"), t.get("mode"), t.get("case")
    p.dram_over_predicted = _ratio(row.dram_bytes, p.bytes)


def _gaps(row: KernelRow, gpu: GPU) -> list[str]:
    p, out = row.predicted, []
    r = p.dram_over_predicted
    if r is not None and not 1 / BYTES_GAP <= r <= BYTES_GAP:
        out.append(f"DRAM bytes {r:.2f}x the traffic prediction ({p.traffic_match}; outside [1/{BYTES_GAP:g}, "
                   f"{BYTES_GAP:g}]x)")
    if p.occupancy and row.achieved_occupancy is not None and row.achieved_occupancy < OCCUPANCY_GAP * p.occupancy:
        out.append(f"achieved occupancy {row.achieved_occupancy:.2f} below {OCCUPANCY_GAP:g}x the predicted "
                   f"{p.occupancy:.2f}")
    if not same_registers(p.regs, row.registers, gpu):
        out.append(f"{row.registers} registers measured, {p.regs} predicted: a different compilation was profiled")
    elif (p.occupancy is not None and row.theoretical_occupancy is not None
          and abs(p.occupancy - row.theoretical_occupancy) > THEORETICAL_TOL):
        out.append(f"theoretical occupancy {row.theoretical_occupancy:.2f} by the profiler, {p.occupancy:.2f} "
                   f"predicted (limiter {row.occupancy_limiter} vs {p.occupancy_limiter}): the occupancy model "
                   "is off for this launch")
    return out


def analyse(profile: Profile, gpu: GPU, inspect_doc: dict[str, Any] | None = None,
            traffic_doc: dict[str, Any] | None = None) -> list[KernelRow]:
    rows = []
    ours = wavefront_kernels()
    for la in profile.launches:
        row = place(la, gpu)
        row.predicted.source = ours.get(short_name(la.kernel))
        if inspect_doc:
            _match_inspect(row, inspect_doc.get("rows", []), gpu)
        if traffic_doc:
            _match_traffic(row, traffic_doc.get("rows", []))
        row.gaps = _gaps(row, gpu)
        rows.append(row)
    return rows
