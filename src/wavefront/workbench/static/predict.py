"""Predicted fraction of peak per kernel: a model over the static gate's facts, never a measurement.

Every figure this module returns is **predicted (model), not measured**: no GPU ran these kernels. Inputs are
what the workbench already reads without a GPU: ``wavefront inspect`` rows (matrix instruction family, wait
depth, overlap depth, consumer warpgroups and ping-pong, mask instructions and barriers inside the main loop,
occupancy, spills) and ``wavefront traffic`` rows (bytes the kernels request against the op's minimum), both as
committed in ``benchmarks/baselines/static.json``, plus the device table (``workbench.hardware``). For the
matrix-unit kernels the caller adds a :class:`LoopShape` (the tile the kernel's config table picks at the case's
shape: ``workbench.jobs.predict`` builds it from the tables themselves).

**Memory-bound ops** (one row per op x mode x case x target; fraction of HBM bandwidth)::

    predicted      = hbm_ceiling(target) x min_bytes / bytes_moved                      (every re-read from HBM)
    predicted_high = hbm_ceiling(target) x min_bytes / max(min_bytes, unique + host)    (every re-read hits cache)

``bytes_moved`` is the traffic row's cache-less count (every re-read counted again, plus the PyTorch work the op
does besides its kernels), so a row whose kernels read their input twice predicts half the ceiling;
``unique_bytes`` is the footprint of the op's kernels (a byte touched twice counts once), so the high figure is
the same row when the second read hits L1/L2. The truth lies between; which end depends on the cache, which
no stand-in sees. A tensor read and written in place counts once in the footprint, so the high figure is
capped at the ceiling. The ceiling is what a well-tuned streaming kernel reaches (:data:`TARGETS`, each with
its source). Where the caller gives the op's minimum bytes at the bench shape (the traffic row is counted at
fewer rows), each of the op's launches also costs :data:`LAUNCH_US`::

    t_stream = bench_min_bytes x (bytes_moved / min_bytes) / (hbm_ceiling x HBM bandwidth)
    predicted = (bench_min_bytes / HBM bandwidth) / (t_stream + launches x LAUNCH_US)

which matters only for small ops (a router's few hundred kilobytes), not for the norms' hundreds of megabytes.

**Matrix-unit kernels** (one row per kernel x case x target; fraction of the dense matrix peak of the dtype).
Per main-loop iteration of one CTA (clock cycles of one SM/CU)::

    t_tensor   = tensor FLOPs / tensor FLOP per clk
    t_other    = max(valu ops / FP32 lanes per clk, transcendentals / MUFU per clk)
                 + loop_mask_ops x consumer warps per issue port          (mask instructions, issued per warp)
    t_barriers = loop_barriers x BARRIER_CLK
    t_drain    = DRAIN_CLK / consumer warpgroups   if mma_wait_depth == 0 and nothing overlaps (sm_90)
    t_iter     = max(t_tensor, t_other) + t_barriers            overlapped: ping-pong, overlap depth >= 1,
                                                                 or >= 2 CTAs resident on the SM/CU
               = t_tensor + t_other + t_barriers + t_drain      otherwise (the softmax waits for the GEMM)
    loop       = t_tensor / t_iter
    tile       = loop clk per tile / (loop clk per tile + TILE_FIXED_CLK)    prologue, first loads, epilogue
    waves      = tiles / (ceil(tiles / slots) x slots),   slots = SMs x CTAs per SM       (tail quantization)
    predicted  = tensor_ceiling(target) x loop x tile x waves x useful

``useful`` is the share of executed matrix work that the op's FLOP count counts (the causal diagonal blocks
compute masked-off halves). The backward of attention is also given per op: its five counted products over the
time of the dK/dV kernel's four and the dQ kernel's three (the delta pre-pass, a memory-bound read of O and dO,
is left out).

What the model leaves out (each could move a figure either way; a GPU run decides): L2 hit rates (the memory
rows bracket them with their two figures), bytes-in-flight limits at low occupancy, spill traffic (rows with
spills are flagged, not charged), the issue cost of address arithmetic in the GEMM loops, the cost of
``bar.sync`` turn-taking beyond :data:`BARRIER_CLK`, shared-memory/LDS bandwidth limits, power-limited clocks,
and the launch overhead of the matrix-unit kernels (long enough not to matter at the bench shapes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from wavefront.archs import get_arch
from wavefront.workbench.document import encode
from wavefront.workbench.hardware import GPU, gpu_for_target

SCHEMA = "wavefront.predict/1"
LABEL = "predicted (model), not measured"

# Model constants: assumptions, not measurements (docs/predicted-peak.md lists them with the rest).
#: Cycles one CTA-wide barrier inside the main loop costs when the warps arrive together (tens of cycles on
#: NVIDIA and CDNA; the larger cost, warps waiting for the slowest one, is in the serialization terms).
BARRIER_CLK = 32
#: Cycles a warpgroup idles when it drains its own wgmma group before issuing the next one (wait depth 0) and
#: nothing else is issued meanwhile: the order of one wgmma group's completion latency.
DRAIN_CLK = 128
#: Cycles per output tile outside the main loop: the first loads (exposed), the prologue and the epilogue
#: (the FA3-schedule read in docs/kernels-attention-gemm.md: about 2,000 clk a tile).
TILE_FIXED_CLK = 2000
#: Microseconds of fixed cost per kernel launch of a memory-bound op (ramp-up, the last wave's tail, the gap
#: to the next kernel in the stream).
LAUNCH_US = 3.0


@dataclass(frozen=True)
class TargetModel:
    """Per-SM (NVIDIA) or per-CU (AMD) issue rates of one compile target, and the achievable ceilings."""

    target: str
    tensor_flop_per_clk: Mapping[str, int]  # dense, by dtype ("bf16", "fp8"), per SM/CU
    valu_lanes_per_clk: int  # FP32 lanes (non-packed) per SM/CU
    mufu_per_clk: int  # transcendental (exp2) results per SM/CU
    issue_ports: int  # warp schedulers (NVIDIA sub-partitions) or SIMDs (AMD) per SM/CU
    tensor_ceiling: float  # achievable fraction of the dense matrix peak for a well-tuned GEMM
    tensor_ceiling_source: str
    hbm_ceiling: float  # achievable fraction of the HBM bandwidth for a well-tuned streaming kernel
    hbm_ceiling_source: str

    @property
    def gpu(self) -> GPU:
        return gpu_for_target(self.target)


TARGETS: dict[str, TargetModel] = {
    t.target: t
    for t in (
        # H100 SXM: 989.4 dense bf16 TFLOP/s = 132 SMs x 4096 FLOP/clk x 1.83 GHz; 4 sub-partitions of 32 FP32
        # lanes and 4 MUFU lanes each (16 exp2 per clk per SM).
        TargetModel("sm_90", {"bf16": 4096, "fp8": 8192}, 128, 16, 4,
                    0.80, "best achievable bf16 matmul on H100: 794 of 989 TFLOP/s (stas00 ml-engineering MAMF "
                          "table); an H200 measured 769-798 (8192^3, random data)",
                    0.90, "quack RMSNorm 3.02 TB/s of H100's 3.35 (quack README); an H200 device-to-device copy "
                          "measured 4.3 of 4.8 TB/s"),
        # B200: 2,250 dense bf16 TFLOP/s = 148 SMs x 8192 FLOP/clk x 1.86 GHz; the same CUDA-core and MUFU rates
        # per SM as Hopper (the tensor rate doubled, the exp rate did not).
        TargetModel("sm_100", {"bf16": 8192, "fp8": 16384}, 128, 16, 4,
                    0.80, "assumed equal to H100's (no published achievable-matmul figure in the project's facts)",
                    0.90, "assumed equal to H100's (no published streaming figure in the project's facts)"),
        # MI300X: 1,307.4 dense bf16 TFLOP/s = 304 CUs x 2048 FLOP/clk x 2.1 GHz; 4 SIMDs of 16 FP32 lanes (the
        # 163.4 TFLOP/s vector figure counts packed FP32), transcendentals at a quarter rate (16 per clk per CU).
        TargetModel("gfx942", {"bf16": 2048, "fp8": 4096}, 64, 16, 4,
                    0.51, "best achievable bf16 matmul on MI300X: 668 of 1,307 TFLOP/s (stas00 ml-engineering "
                          "MAMF table)",
                    0.80, "assumption: no published MI300X streaming figure in the project's facts"),
    )
}


def target_model(target: str) -> TargetModel:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}; got {target!r}")
    return TARGETS[target]


@dataclass(frozen=True)
class LoopShape:
    """What one CTA does per main-loop iteration of a matrix-unit kernel at one case, and how many tiles."""

    tensor_flop: float  # matrix FLOPs per iteration (2 x M x N x K summed over the products)
    valu_ops: float  # FP32 element operations per iteration outside the matrix unit (softmax, scales)
    mufu_ops: float  # transcendentals (exp2) per iteration
    iterations_per_tile: float  # mean main-loop iterations per output tile
    tiles: int  # output tiles (programs' work items) in the launch
    useful: float = 1.0  # counted / executed matrix work (causal diagonal blocks)
    dtype: Literal["bf16", "fp8"] = "bf16"
    note: str = ""  # the tile, e.g. "128x128x64"


@dataclass
class PredictedRow:
    """One predicted fraction of peak; ``terms`` hold every factor, so a figure can be rebuilt by hand."""

    op: str
    mode: str
    case: str
    kernel: str  # the kernel (matrix rows) or "(op)" (memory rows and the attention backward as one)
    target: str
    bound: Literal["memory", "compute"]
    of: str  # what the fraction is of: "HBM bandwidth", "dense bf16 matrix peak", ...
    predicted: float | None  # None: not modelled (see flags); memory rows: every re-read from HBM
    predicted_high: float | None = None  # memory rows: every re-read hits cache (else None)
    terms: dict[str, float] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    label: str = LABEL

    @property
    def key(self) -> str:
        return f"{self.op}/{self.mode}/{self.case}/{self.kernel}@{self.target}"


@dataclass
class PredictReport:
    SCHEMA: ClassVar[str] = SCHEMA

    rows: list[PredictedRow]
    source: str  # where the inspect and traffic facts came from

    def as_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "label": LABEL, "source": self.source,
                "constants": {"BARRIER_CLK": BARRIER_CLK, "DRAIN_CLK": DRAIN_CLK, "TILE_FIXED_CLK": TILE_FIXED_CLK,
                              "LAUNCH_US": LAUNCH_US},
                "targets": {k: encode(v) | {"device": v.gpu.name} for k, v in TARGETS.items()},
                "rows": [encode(r) | {"key": r.key} for r in self.rows]}


# ---------------------------------------------------------------------------------------------------
# Memory-bound ops.


def predict_memory(op: str, mode: str, case: str, target: str, traffic: Mapping[str, Any],
                   kernels: Iterable[Mapping[str, Any]] = (), traffic_case: str | None = None,
                   bench_min_bytes: int | None = None) -> PredictedRow:
    """Fraction of HBM bandwidth of one op x mode x case on `target` from its traffic row and the inspect rows
    of its kernels at that case (the spill flag; their number is the launch count). traffic_case: the traffic
    row's case where it is not `case` (ops whose traffic cases are not their bench cases); bench_min_bytes: the
    op's minimum bytes at `case` (adds the launch cost, see the module docstring)."""
    kernels = list(kernels)
    tm = target_model(target)
    row = PredictedRow(op, mode, case, "(op)", target, "memory", "HBM bandwidth", None)
    if traffic_case and traffic_case != case:
        row.flags.append(f"traffic counted at case {traffic_case}")
    if traffic.get("error"):
        row.flags.append(f"traffic not counted: {traffic['error']}")
        return row
    min_bytes, moved = int(traffic["min_bytes"]), int(traffic["bytes_moved"])
    if min_bytes <= 0 or moved <= 0:
        row.flags.append("no bytes to model")
        return row
    passes = moved / min_bytes
    footprint = int(traffic.get("unique_bytes") or 0) + int(traffic.get("host_bytes") or 0)
    row.terms = {"hbm_ceiling": tm.hbm_ceiling, "min_bytes": min_bytes, "bytes_moved": moved,
                 "bytes_over_min": passes, "footprint_bytes": footprint}
    high_passes = max(min_bytes, footprint) / min_bytes if footprint else passes
    row.predicted = tm.hbm_ceiling / max(passes, 1.0)
    row.predicted_high = tm.hbm_ceiling / max(high_passes, 1.0)
    if bench_min_bytes:
        bw = tm.gpu.hbm_tbps * 1e6  # bytes per microsecond
        launches = max(1, len(kernels))
        row.terms |= {"bench_min_bytes": bench_min_bytes, "launches": launches, "t_ideal_us": bench_min_bytes / bw}

        def with_launches(p: float) -> float:
            t_stream = bench_min_bytes * max(p, 1.0) / (tm.hbm_ceiling * bw)
            return (bench_min_bytes / bw) / (t_stream + launches * LAUNCH_US)

        row.predicted, row.predicted_high = with_launches(passes), with_launches(high_passes)
    if passes < 1.0:
        row.flags.append("moves fewer bytes than the op's minimum formula (the formula over-counts this case)")
    spill = max((int(k.get("spill_bytes") or 0) for k in kernels), default=0)
    if spill:
        row.flags.append(f"spills {spill} B per thread: spill traffic not modelled")
    return row


# ---------------------------------------------------------------------------------------------------
# Matrix-unit kernels.


def ctas_per_sm(inspect: Mapping[str, Any], target: str) -> int:
    """Resident CTAs (workgroups) per SM/CU from the row's occupancy and warps per CTA (at least 1)."""
    arch = get_arch(target)
    warps = int(inspect.get("num_warps") or 0)
    occ = float(inspect.get("occupancy") or 0.0)
    if warps <= 0 or occ <= 0:
        return 1
    resident_warps = occ * arch.max_warps_per_sm * arch.simds_per_cu
    return max(1, int(round(resident_warps / warps)))


def loop_terms(inspect: Mapping[str, Any], loop: LoopShape, target: str) -> dict[str, float]:
    """The per-iteration cycle model (module docstring): every term, and ``loop`` = t_tensor / t_iter."""
    tm = target_model(target)
    t_tensor = loop.tensor_flop / tm.tensor_flop_per_clk[loop.dtype]
    consumers = inspect.get("consumer_warpgroups")
    warps = int(inspect.get("num_warps") or 4)
    consumer_warps = 4 * int(consumers) if consumers else warps
    mask_ops = int(inspect.get("loop_mask_ops") or 0)
    t_other = max(loop.valu_ops / tm.valu_lanes_per_clk, loop.mufu_ops / tm.mufu_per_clk)
    t_other += mask_ops * consumer_warps / tm.issue_ports
    t_barriers = int(inspect.get("loop_barriers") or 0) * BARRIER_CLK
    ctas = ctas_per_sm(inspect, target)
    overlapped = bool(inspect.get("pingpong")) or int(inspect.get("mma_overlap_depth") or 0) >= 1 or ctas >= 2
    drains = inspect.get("mma_wait_depth") == 0 and not overlapped
    t_drain = DRAIN_CLK / max(1, int(consumers or 1)) if drains else 0.0
    if overlapped:
        t_iter = max(t_tensor, t_other) + t_barriers
    else:
        t_iter = t_tensor + t_other + t_barriers + t_drain
    return {"t_tensor": t_tensor, "t_other": t_other, "t_barriers": t_barriers, "t_drain": t_drain,
            "overlapped": float(overlapped), "ctas_per_sm": float(ctas), "t_iter": t_iter, "loop": t_tensor / t_iter}


def predict_compute(op: str, mode: str, case: str, kernel: str, target: str, inspect: Mapping[str, Any],
                    loop: LoopShape) -> PredictedRow:
    """Fraction of the dense matrix peak of one matrix-unit kernel at one case on `target`."""
    tm = target_model(target)
    row = PredictedRow(op, mode, case, kernel, target, "compute", f"dense {loop.dtype} matrix peak", None)
    if not inspect.get("ok", True):
        row.flags.append(f"did not compile: {inspect.get('error')}")
        return row
    terms = loop_terms(inspect, loop, target)
    loop_clk = terms["t_iter"] * loop.iterations_per_tile
    tile = loop_clk / (loop_clk + TILE_FIXED_CLK)
    slots = tm.gpu.sm_count * int(terms["ctas_per_sm"])
    waves = loop.tiles / (math.ceil(loop.tiles / slots) * slots) if loop.tiles > 0 else 1.0
    row.terms = terms | {"tensor_ceiling": tm.tensor_ceiling, "tile": tile, "waves": waves, "useful": loop.useful}
    row.predicted = tm.tensor_ceiling * terms["loop"] * tile * waves * loop.useful
    if loop.note:
        row.flags.append(loop.note)
    if int(inspect.get("spill_bytes") or 0):
        row.flags.append(f"spills {inspect['spill_bytes']} B per thread: not modelled")
    return row


def combine(op: str, mode: str, case: str, target: str, parts: Iterable[tuple[PredictedRow, float]],
            counted: float, of: str) -> PredictedRow:
    """One op-level fraction from kernels run one after another: parts are (kernel row, its executed matrix
    work in the unit of `counted`); time is the sum of work / fraction, the op's fraction counted / time."""
    row = PredictedRow(op, mode, case, "(op)", target, "compute", of, None)
    time = 0.0
    for part, work in parts:
        if part.predicted is None or part.predicted <= 0:
            row.flags.append(f"{part.kernel} not modelled")
            return row
        time += work / part.predicted
        row.terms[f"{part.kernel}_work"] = work
    row.terms["counted"] = counted
    row.predicted = counted / time if time else None
    return row
