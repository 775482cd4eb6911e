"""The modeled roofline of a bench case on a device from the table: what the CPU main job can say.

For one call of an op in a mode, the registry gives FLOPs and the minimal bytes that must cross HBM.
The attainable time on a device is the larger of the two lower bounds

    t_memory  = min_bytes / HBM bandwidth          t_compute = FLOPs / dense peak of the dtype

(fp32 uses the non-tensor FP32 peak, 16-bit dtypes the dense matrix peak), and the case is memory- or
compute-bound by which one wins. Arithmetic intensity is FLOPs / min_bytes. These are model numbers,
derived from datasheet figures: no device was run to get them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from wavefront.ops._spec import dtype_name
from wavefront.workbench.bench.runnable import formula
from wavefront.workbench.hardware import GPU


@dataclass(frozen=True)
class Modeled:
    op: str
    case: str
    mode: str
    dtype: str
    device: str  # key in wavefront.workbench.hardware.GPUS
    flops: float
    min_bytes: int
    intensity: float  # FLOP / byte
    attainable_us: float
    bound: str  # "memory" | "compute"
    peak_tflops: float
    hbm_tbps: float

    @property
    def attainable_tflops(self) -> float:
        return self.flops / (self.attainable_us * 1e6) if self.attainable_us > 0 else 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"attainable_tflops": self.attainable_tflops}


def compute_roof_tflops(gpu: GPU, dtype: str) -> float:
    return gpu.fp32_tflops if dtype == "fp32" else gpu.peak_tflops(dtype)


def model_case(spec, case, dtype, mode: str, gpu: GPU) -> Modeled:
    """Attainable time of one call on `gpu`; see the module docstring."""
    flops, n_bytes = formula(spec, case, dtype, mode)
    name = dtype_name(dtype)
    peak = compute_roof_tflops(gpu, name)
    t_mem_us = n_bytes / (gpu.hbm_tbps * 1e12) * 1e6
    t_cmp_us = flops / (peak * 1e12) * 1e6
    return Modeled(spec.name, case.name, mode, name, gpu.key, flops, n_bytes,
                   flops / n_bytes if n_bytes else float("inf"), max(t_mem_us, t_cmp_us),
                   "memory" if t_mem_us >= t_cmp_us else "compute", peak, gpu.hbm_tbps)


def achieved(flops: float, n_bytes: int, median_us: float, gpu: GPU | None, dtype: str,
             copy_gbps: float | None) -> dict[str, float | None]:
    """Achieved GB/s and TFLOP/s from a measured median, as % of the device's peaks and measured copy."""
    if median_us <= 0:
        raise ValueError(f"median_us must be > 0, got {median_us}")
    gbps = n_bytes / (median_us * 1e-6) / 1e9
    tflops = flops / (median_us * 1e-6) / 1e12
    out: dict[str, float | None] = {"gbps": gbps, "tflops": tflops, "pct_peak_bw": None, "pct_peak_flops": None,
                                    "pct_copy_bw": None}
    if gpu is not None:
        out["pct_peak_bw"] = 100.0 * gbps / (gpu.hbm_tbps * 1e3)
        out["pct_peak_flops"] = 100.0 * tflops / compute_roof_tflops(gpu, dtype)
    if copy_gbps:
        out["pct_copy_bw"] = 100.0 * gbps / copy_gbps
    return out
