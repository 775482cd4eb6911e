"""One kernel launch as a vendor profiler measured it, in base units (ns, bytes, FLOP), whatever the tool.

Every measured field is ``None`` when the profile does not hold the counters it needs: a missing metric is
"not measured", never 0. ``metrics`` keeps every raw counter of the launch in base units (bytes, ns,
fractions for percentages) under the tool's own names, so nothing the tool wrote is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The documents of ``wavefront counters`` (one profile) and of its A/B form (two profiles).
SCHEMA = "wavefront.counters/1"
COMPARE_SCHEMA = "wavefront.counters.compare/1"


class CountersLoadError(ValueError):
    """A profile that cannot be read: the message names the file and what was expected (one line)."""


@dataclass
class Launch:
    tool: str  # "ncu" | "rocprofv3" | "rocprof-compute"
    launch_id: int  # ncu "ID", rocprof "Dispatch_Id"
    kernel: str  # the name as the tool reports it (demangled)
    n_blocks: int | None  # blocks (NVIDIA) / workgroups (AMD) in the grid
    grid: tuple[int, ...] | None  # per dimension where the tool gives it (ncu), else None
    threads_per_block: int | None
    duration_ns: float | None
    tensor_flops: float | None  # matrix pipe: NVIDIA tensor cores, AMD MFMA
    vector_flops: float | None  # FMA/VALU pipe floating-point work (FP32 and FP16)
    dram_bytes: float | None  # DRAM / HBM read + write
    l2_bytes: float | None
    l1_bytes: float | None  # NVIDIA L1TEX (includes shared memory); AMD vector L1 (vL1D)
    lds_bytes: float | None  # AMD LDS; None on NVIDIA (inside l1_bytes)
    achieved_occupancy: float | None  # fraction of the maximum resident warps per SM / waves per SIMD
    registers: int | None  # per thread (NVIDIA) / arch VGPRs per lane (AMD)
    shared_bytes: int | None  # shared memory / LDS per block
    stalls: dict[str, float] = field(default_factory=dict)  # reason -> value, largest first
    stall_unit: str = ""
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def flops(self) -> float | None:
        """All measured floating-point work; None when neither pipe was measured."""
        parts = [f for f in (self.tensor_flops, self.vector_flops) if f is not None]
        return sum(parts) if parts else None

    @property
    def shape(self) -> tuple[str, int | None, int | None]:
        """What repeats of one launch share: kernel name, blocks, threads per block."""
        return (self.kernel, self.n_blocks, self.threads_per_block)


@dataclass
class Profile:
    path: str
    tool: str
    format: str  # what was recognised, with the version the reader was written against
    launches: list[Launch]
    device: str | None = None  # the device name the file states, where it states one
    notes: list[str] = field(default_factory=list)


def number(text: str, path: str, where: str) -> float | None:
    """A value cell: '' or 'n/a' is not measured (None); thousands separators are dropped."""
    t = text.strip().replace(",", "")
    if t in ("", "n/a", "N/A", "-", "nan"):
        return None
    try:
        return float(t)
    except ValueError:
        raise CountersLoadError(f"{path}: {where}: expected a number, got {text!r}") from None


def short_name(kernel: str) -> str:
    """The function name inside a demangled signature: 'void ns::k<int>(float*)' -> 'k'; '#2' and '.kd' off."""
    name = kernel.split("#")[0].strip()
    if name.endswith(".kd"):  # AMD kernel descriptor symbols, as older rocprof versions name kernels
        name = name[:-3]
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the argument list starts at the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    while name.endswith(">"):  # drop the template arguments
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {">": 1, "<": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
        else:
            break
    return name.split()[-1].split("::")[-1] if name.split() else name
