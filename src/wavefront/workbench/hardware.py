"""The device table: one row per GPU, every figure with its source, dense (never 2:4-sparse) peaks.

Per-architecture on-chip limits (registers, shared memory/LDS, warps or waves per SM/CU) live in
:data:`wavefront.runtime.ARCHS`, keyed by each row's ``arch``; this table holds the product figures that
differ between parts of one architecture (H100 vs H200 share sm_90 but not their memory).

An unknown GPU is an error listing the known ones: there is no silent fallback to some default part.

Sources (also in ../shared/facts/devices.md):
  A100:   NVIDIA A100 datasheet (r4); glennklockwood.com/garden/processors/A100.
  A100 40GB: NVIDIA A100 datasheet r4 (40 GB HBM2 at 1,555 GB/s; compute as the 80GB part).
  H100:   NVIDIA H100 datasheet (its 1,979 TFLOPS BF16 is with sparsity; dense is half);
          glennklockwood.com/garden/processors/h100 for dense matrix values.
  H200:   NVIDIA H200 product page (https://www.nvidia.com/en-us/data-center/h200/); same GH100 compute.
  B200:   DGX B200 datasheet; glennklockwood.com/garden/processors/B200 (HGX, 1000 W); chipsandcheese
          "Nvidia's B200" (148 SMs, 126 MB L2).
  MI300X, MI325X, MI250X: ROCm docs/conceptual/gpu-arch/mi300.md and mi250.md, ROCm
          docs/reference/gpu-arch-specs.rst, AMD product pages.
  W7900:  AMD Radeon PRO W7900 product page (96 CUs, 48 GB GDDR6, 864 GB/s, 295 W TBP, PCIe 4.0 x16;
          61.3 TFLOPS FP32 and 122.6 TFLOPS FP16 peak with dual issue / WMMA at 2.495 GHz boost); the RDNA3
          (gfx1100, wave32) row, so the wave32 target has a device for occupancy and roofline.
  Prices: dated defaults from ../shared/facts/training-math.md ("Prices ($/GPU-hour)", mid-2026);
          on-demand per GPU-hour, to be overridden by users.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from wavefront.archs import Arch, get_arch


@dataclass(frozen=True)
class GPU:
    key: str  # short name used on the command line: "h100"
    name: str
    vendor: str  # "nvidia" | "amd"
    arch: str  # compile target, a key of wavefront.runtime.ARCHS
    bf16_tflops: float  # dense matrix peak, BF16 and FP16
    fp8_tflops: float | None  # dense; None where the part has no FP8 matrix path
    tf32_tflops: float | None  # dense matrix TF32/XF32
    fp32_tflops: float  # non-tensor FP32 (vector)
    hbm_tbps: float  # HBM bandwidth, TB/s (1e12 B/s)
    hbm_gb: float  # capacity, GB (1e9 B)
    l2_mb: float  # L2 per device (AMD: sum over XCDs)
    llc_mb: float  # last-level cache beyond L2 (AMD Infinity Cache); 0 where none
    sm_count: int  # SMs (NVIDIA) or CUs (AMD)
    tdp_w: float
    scaleup_gbps_per_dir: float  # per-GPU scale-up link bandwidth, one direction, GB/s
    price_per_hour: float | None  # default on-demand $/GPU-hour (mid-2026); None: no sourced figure
    source: str

    @property
    def ridge_bf16(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the BF16 roof meets the memory roof."""
        return self.bf16_tflops / self.hbm_tbps

    def peak_tflops(self, dtype: str) -> float:
        """Dense matrix peak for a dtype name ("bf16", "fp16", "fp8", "tf32", "fp32")."""
        table = {
            "bf16": self.bf16_tflops,
            "fp16": self.bf16_tflops,
            "fp8": self.fp8_tflops,
            "tf32": self.tf32_tflops,
            "fp32": self.fp32_tflops,
        }
        if dtype not in table:
            raise ValueError(f"dtype must be one of {sorted(table)}, got {dtype!r}")
        value = table[dtype]
        if value is None:
            raise ValueError(f"{self.name} has no dense {dtype} matrix peak")
        return value

    @property
    def limits(self) -> Arch:
        """Per-SM/CU on-chip limits of the part's architecture (registers, shared memory/LDS, warps/waves)."""
        return get_arch(self.arch)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ridge_bf16": self.ridge_bf16, "limits": asdict(self.limits)}


GPUS: dict[str, GPU] = {
    g.key: g
    for g in (
        GPU("a100", "NVIDIA A100 80GB SXM", "nvidia", "sm_80", 312.0, None, 156.0, 19.5, 2.039, 80, 40, 0,
            108, 400, 300, 1.50, "NVIDIA A100 datasheet r4; NVLink3 600 GB/s bidirectional"),
        GPU("a100-40gb", "NVIDIA A100 40GB SXM", "nvidia", "sm_80", 312.0, None, 156.0, 19.5, 1.555, 40, 40, 0,
            108, 400, 300, None, "NVIDIA A100 datasheet r4 (40 GB HBM2, 1,555 GB/s); same GA100 compute as the 80GB"),
        GPU("h100", "NVIDIA H100 SXM", "nvidia", "sm_90", 989.4, 1978.9, 494.7, 66.9, 3.35, 80, 50, 0,
            132, 700, 450, 2.99, "NVIDIA H100 datasheet (dense = half the sparse headline); NVLink4 900 GB/s"),
        GPU("h200", "NVIDIA H200 SXM", "nvidia", "sm_90", 989.4, 1978.9, 494.7, 66.9, 4.8, 141, 50, 0,
            132, 700, 450, 3.80, "NVIDIA H200 product page; same GH100 compute as H100"),
        # H100 PCIe / NVL: NVIDIA H100 datasheet (Technical Specifications table; its tensor figures are with
        # sparsity, dense is half): PCIe BF16 1,513 -> 756.5, FP8 3,026, TF32 756, FP32 51 TFLOPS, 80 GB HBM2e at
        # 2 TB/s, 114 SMs, 350 W; NVL BF16 1,671 -> 835.5, FP8 3,341, TF32 835, FP32 60, 94 GB HBM3 at 3.9 TB/s,
        # 132 SMs, 350-400 W. (torchtitan's get_peak_flops uses the same dense 756e12 and 835e12.) Their NVLink
        # bridge (600 GB/s) joins pairs only, so an 8-GPU server's collectives run over PCIe Gen5 x16: 64 GB/s
        # per direction (the datasheet's 128 GB/s both ways).
        GPU("h100-pcie", "NVIDIA H100 PCIe", "nvidia", "sm_90", 756.5, 1513.0, 378.0, 51.0, 2.0, 80, 50, 0,
            114, 350, 64, None, "NVIDIA H100 datasheet (PCIe column, dense = half the sparse figures)"),
        GPU("h100-nvl", "NVIDIA H100 NVL", "nvidia", "sm_90", 835.5, 1670.5, 417.5, 60.0, 3.9, 94, 50, 0,
            132, 400, 64, None, "NVIDIA H100 datasheet (NVL column, dense = half the sparse figures)"),
        GPU("b200", "NVIDIA B200 (HGX, 1000 W)", "nvidia", "sm_100", 2250.0, 4500.0, 1125.0, 80.0, 8.0, 180,
            126, 0, 148, 1000, 900, 5.00, "DGX B200 datasheet; chipsandcheese B200; NVLink5 1.8 TB/s"),
        # GB200: one Blackwell GPU of a GB200 NVL72 rack, from NVIDIA's GB200 NVL72 specifications (per rack, with
        # sparsity: FP8 720 PF, FP16/BF16 360 PF, TF32 180 PF; FP32 5,760 TF; 13.4 TB HBM3e at 576 TB/s; NVLink
        # 130 TB/s) divided by 72 GPUs and halved for dense. Not on that page, assumed: 148 SMs and 126 MB L2 (the
        # B200 die pair, chipsandcheese) and 1,200 W per GPU. The 72-GPU NVLink domain: --gpus-per-node 72.
        GPU("gb200", "NVIDIA GB200 (one GPU of an NVL72)", "nvidia", "sm_100", 2500.0, 5000.0, 1250.0, 80.0, 8.0,
            186, 126, 0, 148, 1200, 900, None, "NVIDIA GB200 NVL72 specifications, per GPU; SMs/L2/power assumed"),
        GPU("mi300x", "AMD Instinct MI300X", "amd", "gfx942", 1307.4, 2614.9, 653.7, 163.4, 5.3, 192, 32,
            256, 304, 750, 448, 2.00, "ROCm mi300.md peak table; gpu-arch-specs.rst; AMD product page"),
        GPU("mi325x", "AMD Instinct MI325X", "amd", "gfx942", 1307.4, 2614.9, 653.7, 163.4, 6.0, 256, 32,
            256, 304, 1000, 448, None, "ROCm gpu-arch-specs.rst; AMD MI325X product page"),
        # MI355X: AMD Instinct MI355X product page / datasheet: FP16/BF16 2.5 PF dense (5.0 with sparsity), FP8 5.0 PF
        # dense, FP32 matrix/vector 157.3 TF, no TF32 (gfx950), 288 GB HBM3E at 8 TB/s, 256 CUs, 1,400 W TBP,
        # Infinity Fabric 7 links x 153.6 GB/s (both ways) = 537.6 GB/s per direction; L2 4 MB per XCD x 8 and
        # 256 MB Infinity Cache (ROCm gpu-arch-specs).
        GPU("mi355x", "AMD Instinct MI355X", "amd", "gfx950", 2500.0, 5000.0, None, 157.3, 8.0, 288, 32, 256,
            256, 1400, 537.6, None, "AMD Instinct MI355X product page; ROCm gpu-arch-specs"),
        GPU("mi250x", "AMD Instinct MI250X (both GCDs)", "amd", "gfx90a", 383.0, None, None, 47.9, 3.2,
            128, 16, 0, 220, 560, 350, None, "ROCm mi250.md; AMD MI250X page. Shows up as two devices"),
        GPU("mi250x-gcd", "AMD Instinct MI250X (one GCD)", "amd", "gfx90a", 191.5, None, None, 23.95, 1.6,
            64, 8, 0, 110, 280, 175, None, "Half of the MI250X row: torch sees each GCD as one device"),
        # RDNA3 has no FP8 or TF32 matrix path; its scale-up link is PCIe 4.0 x16 (~32 GB/s per direction).
        GPU("w7900", "AMD Radeon PRO W7900", "amd", "gfx1100", 122.6, None, None, 61.3, 0.864, 48, 6, 96,
            96, 295, 32, None, "AMD Radeon PRO W7900 product page (RDNA3, Navi 31)"),
    )
}

#: The device whose SM/CU count a compile target's launches assume when inspected ahead of time (the
#: persistent-program count of row-wise backward passes depends on it).
TARGET_GPUS: dict[str, str] = {"sm_80": "a100", "sm_90": "h100", "sm_100": "b200", "gfx90a": "mi250x-gcd",
                               "gfx942": "mi300x", "gfx1100": "w7900"}

_ALIASES = {
    "a100": "a100", "a10080gb": "a100", "a100sxm": "a100", "a10040gb": "a100-40gb", "a10040gbsxm": "a100-40gb",
    "h100": "h100", "h100sxm": "h100", "h10080gbhbm3": "h100", "h100pcie": "h100-pcie", "h100nvl": "h100-nvl",
    "gb200": "gb200", "mi355x": "mi355x",
    "h200": "h200", "h200sxm": "h200",
    "b200": "b200",
    "mi300x": "mi300x", "mi325x": "mi325x",
    "mi250x": "mi250x", "mi250xgcd": "mi250x-gcd",
    "w7900": "w7900", "radeonprow7900": "w7900",
}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("amd", "").replace("instinct", ""))


def get_gpu(name: str) -> GPU:
    """Row for a short name ("h100", "MI300X", "h100-sxm"); unknown names list the known ones."""
    key = _ALIASES.get(_norm(name))
    if key is None:
        known = ", ".join(sorted(GPUS))
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {known}")
    return GPUS[key]


def gpu_from_device_name(device_name: str) -> GPU:
    """Row for a name as torch.cuda.get_device_name() reports it ("NVIDIA H200", "AMD Instinct MI300X").

    A device that torch reports for an MI250X is one GCD, so it maps to the per-GCD row.
    """
    norm = _norm(device_name)
    for pattern, key in (("w7900", "w7900"), ("mi250", "mi250x-gcd"), ("mi325", "mi325x"), ("mi300", "mi300x"),
                         ("mi355", "mi355x"), ("gb200", "gb200"), ("b200", "b200"), ("h200", "h200"),
                         ("h100pcie", "h100-pcie"), ("h100nvl", "h100-nvl"), ("h100", "h100"),
                         ("a100sxm440gb", "a100-40gb"), ("a100pcie40gb", "a100-40gb"), ("a100", "a100")):
        if pattern in norm:
            return GPUS[key]
    known = ", ".join(g.name for g in GPUS.values())
    raise ValueError(f"GPU {device_name!r} is not in the device table; known: {known}")


def gpu_for_target(arch: str) -> GPU:
    """The representative device of a compile target (:data:`TARGET_GPUS`); unknown targets list the known."""
    if arch not in TARGET_GPUS:
        raise ValueError(f"no device in the table for target {arch!r}; known targets: {', '.join(TARGET_GPUS)}")
    return GPUS[TARGET_GPUS[arch]]
