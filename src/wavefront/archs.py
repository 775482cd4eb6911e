"""The compile targets' launch and occupancy limits: pure data, importable without torch or Triton.

The inspect tool uses it for occupancy of ahead-of-time compiled kernels, the planner and the device
table for per-SM limits, and the launch-config functions take an :class:`Arch` so they can be tested as
pure functions on any machine. :mod:`wavefront.runtime` re-exports everything here and adds what needs
the live machine (backend, the current device's architecture).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["nvidia", "amd-cdna", "amd-rdna", "cpu"]


@dataclass(frozen=True)
class Arch:
    """Launch and occupancy limits of one compile target (per SM on NVIDIA, per CU/SIMD on AMD)."""

    name: str  # compile target: "sm_90", "gfx942", or "cpu"
    family: Family
    warp_size: int  # lanes per warp (NVIDIA) or wavefront (AMD)
    max_threads_per_block: int
    shared_mem_per_block: int  # bytes a block may allocate (opt-in maximum on NVIDIA; LDS on AMD)
    shared_mem_per_sm: int  # bytes per SM / CU (AMD RDNA: per WGP, see simds_per_cu)
    regs_per_thread_max: int  # architectural VGPRs (AMD: plus AGPRs where unified)
    # Occupancy resources. NVIDIA: per SM. AMD: per SIMD (a CU has `simds_per_cu` of them).
    max_warps_per_sm: int  # NVIDIA: warps per SM; AMD: waves per SIMD
    max_blocks_per_sm: int  # NVIDIA: resident blocks per SM; AMD: workgroup barriers per CU
    regs_per_sm: int  # NVIDIA: 32-bit registers per SM; AMD: VGPRs per lane per SIMD
    reg_alloc_unit: int  # NVIDIA: registers per warp allocation unit; AMD: VGPR granule per lane
    simds_per_cu: int = 1
    matrix_units: str = ""  # what tensor-core class the target has, for the inspect report
    # Shared memory / LDS allocation granule (bytes) and what the driver reserves per block.
    shared_mem_alloc_unit: int = 128
    reserved_shared_mem_per_block: int = 0
    # NVIDIA: register-file sub-partitions per SM; registers are allocated to warps in each one.
    reg_subpartitions: int = 4

    @property
    def max_num_warps(self) -> int:
        """Largest num_warps a launch may ask for: 32 on NVIDIA, 16 on 64-lane AMD wavefronts."""
        return self.max_threads_per_block // self.warp_size


# Sources.
# NVIDIA: CUDA C Programming Guide, "Technical Specifications per Compute Capability" (8.0, 9.0, 10.0: 64 K
#   32-bit registers, 64 resident warps and 32 resident blocks per SM, 255 registers per thread; shared
#   memory per SM 164 KB on 8.0 and 228 KB on 9.0/10.0, per block 163 KB / 227 KB opt-in) and the CUDA
#   toolkit's cuda_occupancy.h (registers allocated per warp in units of 256 within each of 4 sub-partitions;
#   shared memory allocated in 128-byte units on 8.x+; the driver reserves 1 KB of shared memory per block
#   from compute capability 8.0 on, cudaDevAttrReservedSharedMemoryPerBlock).
# AMD: LLVM AMDGPU backend, Utils/AMDGPUBaseInfo.cpp (IsaInfo): getMaxWavesPerEU (8 on gfx90a/gfx942, 16 on
#   gfx10.3+ incl. gfx1100), getTotalNumVGPRs (512 unified arch+acc VGPRs on gfx90a/gfx942; 1536 in wave32 on
#   gfx1100, which has the 1.5x register file), getVGPRAllocGranule (8 on gfx90a/gfx942; 24 in wave32 on
#   gfx1100), getMaxWorkGroupsPerCU (16 workgroup barriers per CU; 32 on gfx10+ in WGP mode; single-wave
#   workgroups use none), getEUsPerCU (4 SIMDs). LDS: ROCm "GPU hardware specifications" table (64 KiB per
#   CU on gfx90a/gfx942; gfx1100 compiles in WGP mode, where two CUs (4 SIMD32) share 128 KiB and a workgroup
#   may use 64 KiB); LDS allocation granule 128 dwords = 512 B on GFX9 (LLVM AMDGPUUsage, COMPUTE_PGM_RSRC2
#   LDS_SIZE) and 1024 B allocation blocks on GFX10.3/GFX11 (LLVM AMDGPU LDS-granularity patches, 2026).
_NV: dict[str, Any] = dict(family="nvidia", warp_size=32, max_threads_per_block=1024, regs_per_thread_max=255,
           max_warps_per_sm=64, max_blocks_per_sm=32, regs_per_sm=65_536, reg_alloc_unit=256,
           shared_mem_alloc_unit=128, reserved_shared_mem_per_block=1024, reg_subpartitions=4)
_CDNA: dict[str, Any] = dict(family="amd-cdna", warp_size=64, max_threads_per_block=1024, shared_mem_per_block=65_536,
             shared_mem_per_sm=65_536, regs_per_thread_max=512, max_warps_per_sm=8, max_blocks_per_sm=16,
             regs_per_sm=512, reg_alloc_unit=8, simds_per_cu=4, matrix_units="mfma", shared_mem_alloc_unit=512)
ARCHS: dict[str, Arch] = {
    "sm_80": Arch("sm_80", shared_mem_per_block=166_912, shared_mem_per_sm=167_936, matrix_units="mma (HMMA)",
                  **_NV),
    "sm_90": Arch("sm_90", shared_mem_per_block=232_448, shared_mem_per_sm=233_472, matrix_units="wgmma + mma",
                  **_NV),
    "sm_100": Arch("sm_100", shared_mem_per_block=232_448, shared_mem_per_sm=233_472,
                   matrix_units="tcgen05 + mma", **_NV),
    "gfx90a": Arch("gfx90a", **_CDNA),
    "gfx942": Arch("gfx942", **_CDNA),
    # One occupancy unit is a WGP (two CUs, 4 SIMD32, 128 KiB LDS): gfx10+ kernels compile in WGP mode.
    "gfx1100": Arch("gfx1100", family="amd-rdna", warp_size=32, max_threads_per_block=1024,
                    shared_mem_per_block=65_536, shared_mem_per_sm=131_072, regs_per_thread_max=256,
                    max_warps_per_sm=16, max_blocks_per_sm=32, regs_per_sm=1536, reg_alloc_unit=24,
                    simds_per_cu=4, matrix_units="wmma", shared_mem_alloc_unit=1024),
    # The interpreter has no hardware limits; it reuses the NVIDIA shape so configs match sm_90's.
    "cpu": Arch("cpu", shared_mem_per_block=232_448, shared_mem_per_sm=233_472, **{**_NV, "family": "cpu"}),
}

#: The default inspection targets: wave32 and wave64, NVIDIA and AMD.
DEFAULT_TARGETS: tuple[str, ...] = ("sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100")


def compiles_fp8_e4m3(arch: Arch) -> bool:
    """Whether Triton lowers OCP e4m3 (``fp8e4nv``) for `arch`: NVIDIA from sm_89 (Ada) on; Ampere has no
    FP8 conversion instructions and Triton refuses the type there. AMD targets and the interpreter convert
    it (natively on gfx942, in software elsewhere)."""
    if arch.family != "nvidia":
        return True
    digits = "".join(c for c in arch.name.removeprefix("sm_") if c.isdigit())
    return bool(digits) and int(digits) >= 89


def get_arch(name: str) -> Arch:
    """The :class:`Arch` for a compile-target name; an unknown name lists the known ones."""
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(sorted(ARCHS))}") from None


def clamp_num_warps(num_warps: int, arch: Arch) -> int:
    """num_warps limited to what one block may hold on `arch` (16 on 64-lane wavefronts)."""
    if num_warps < 1:
        raise ValueError(f"num_warps must be >= 1, got {num_warps}")
    return min(num_warps, arch.max_num_warps)
