"""What a benchmark run produces, as plain dataclasses: run provenance, measurements, correctness rows.

The results store persists exactly these; JSON exports are their documents (``workbench.document.encode``:
a record's fields, plus what a record's own ``as_dict()`` derives), so a run read back from SQLite or from
an exported file (:meth:`StoredRun.from_dict`) is the same object.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from wavefront.workbench.bench.timer import quantiles_us
from wavefront.workbench.document import decode

#: Timing kinds. Only "gpu" samples are performance figures.
TIMING_GPU = "gpu"
TIMING_CPU = "cpu-interpreter"  # CPU interpreter: not a performance figure
TIMING_NONE = "none"

CPU_LABEL = "CPU interpreter: not a performance figure"


@dataclass
class RunInfo:
    created_utc: str
    label: str
    git_sha: str | None
    git_dirty: bool | None
    device_name: str
    arch: str
    backend: str
    torch: str
    triton: str | None
    python: str
    host: str
    timing: str = TIMING_NONE  # what the measurements' samples are (TIMING_*)
    driver: str | None = None
    copy_gbps: float | None = None  # device-to-device copy measured in the run (bytes read + written)
    flush_bytes: int | None = None
    device_model: str | None = None  # device-table key used for % of peak (GPU) or the modeled roofline
    extra: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    @property
    def is_gpu(self) -> bool:
        return self.timing == TIMING_GPU


@dataclass
class Measurement:
    op: str
    case: str
    mode: str
    dtype: str
    provider: str
    status: str  # "ok" | "unavailable" | "error" | "skipped"
    reason: str = ""
    dims: dict[str, int] = field(default_factory=dict)
    method: str = ""
    flush: str = ""
    n_warmup: int = 0
    calls_per_sample: int = 1
    samples_us: list[float] = field(default_factory=list)
    flops: float = 0.0
    min_bytes: int = 0
    gbps: float | None = None
    tflops: float | None = None
    pct_peak_bw: float | None = None
    pct_peak_flops: float | None = None
    pct_copy_bw: float | None = None
    peak_mem_bytes: int | None = None
    max_diff_vs_eager: float | None = None

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.op, self.case, self.mode, self.dtype, self.provider)

    @property
    def case_key(self) -> tuple[str, str, str, str]:
        """The key without the provider: which providers' results are comparable."""
        return (self.op, self.case, self.mode, self.dtype)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.samples_us)

    def _q(self, q: float) -> float | None:
        if not self.samples_us:
            return None

        return quantiles_us(self.samples_us, (q,))[0]

    @property
    def median_us(self) -> float | None:
        return self._q(0.5)

    @property
    def p10_us(self) -> float | None:
        return self._q(0.1)

    @property
    def p90_us(self) -> float | None:
        return self._q(0.9)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"median_us": self.median_us, "p10_us": self.p10_us, "p90_us": self.p90_us,
                               "n_reps": len(self.samples_us)}


@dataclass
class CorrectnessRow:
    op: str
    case: str
    dtype: str
    passed: bool
    error: str | None = None
    fwd_err_ours: float | None = None
    fwd_err_eager: float | None = None
    fwd_bound: float | None = None
    bwd_err_ours: float | None = None
    bwd_err_eager: float | None = None
    bwd_bound: float | None = None
    wall_s: float = 0.0  # CPU interpreter: not a performance figure

    @classmethod
    def from_check(cls, check) -> CorrectnessRow:
        """From a wavefront.workbench.bench.correctness.CaseCheck: the worst output/gradient per direction."""
        row = cls(check.op, check.case, check.dtype, check.passed, check.error, wall_s=check.wall_s)
        for mode in ("fwd", "bwd"):
            worst = check.worst(mode)
            if worst is not None:
                setattr(row, f"{mode}_err_ours", _finite(worst.err_ours))
                setattr(row, f"{mode}_err_eager", _finite(worst.err_eager))
                setattr(row, f"{mode}_bound", _finite(worst.bound))
        return row


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class StoredRun:
    info: RunInfo
    measurements: list[Measurement] = field(default_factory=list)
    correctness: list[CorrectnessRow] = field(default_factory=list)

    def by_key(self) -> dict[tuple[str, str, str, str, str], Measurement]:
        return {m.key: m for m in self.measurements}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StoredRun:
        return cls(decode(RunInfo, d["info"]), [decode(Measurement, m) for m in d.get("measurements", [])],
                   [decode(CorrectnessRow, c) for c in d.get("correctness", [])])
