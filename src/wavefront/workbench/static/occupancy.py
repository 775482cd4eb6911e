"""Theoretical occupancy of a compiled kernel from its resource usage and the per-arch limits.

NVIDIA (the rules of the CUDA toolkit's ``cuda_occupancy.h``), per SM:

    regs_per_warp   = roundup(regs_per_thread * 32, 256)
    warps_by_regs   = floor((regs_per_sm / 4) / regs_per_warp) * 4     registers live in 4 sub-partitions
    blocks_by_regs  = floor(warps_by_regs / warps_per_block)
    smem_per_block  = roundup(dynamic + max(static, reserved 1 KB), 128)
    blocks_by_smem  = floor(smem_per_sm / smem_per_block)
    blocks_by_warps = floor(max_warps_per_sm / warps_per_block);  blocks <= max_blocks_per_sm
    active warps    = min(blocks_*) * warps_per_block,   occupancy = active warps / max_warps_per_sm

Triton allocates its shared memory dynamically; the cubin's static shared size on sm_90+ is the driver's
1 KB reservation itself, so the reservation is counted once (``max(static, reserved)``).

AMD (the rules of LLVM's AMDGPU backend, ``AMDGPUBaseInfo.cpp``), per SIMD:

    waves_by_vgpr = min(total_vgprs / roundup(vgpr_count, granule), max_waves)   (all if vgprs < granule)
    waves_by_sgpr = CDNA only: 10/9/8/7 waves for <= 80/88/100/more SGPRs (never above max_waves)
    workgroups per CU <= floor(waves_by_regs * simds / waves_per_wg), floor(lds_per_cu / lds_per_wg),
                         floor(max_waves * simds / waves_per_wg) and the barrier limit (single-wave
                         workgroups need no barrier)
    waves per SIMD = min(waves_by_regs, workgroups * waves_per_wg / simds)

``vgpr_count`` is the code object's ``.vgpr_count``: on gfx90a/gfx942 it already counts the AGPRs of the
unified register file (arch VGPRs rounded to 4, then AGPRs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from wavefront.runtime import Arch, get_arch


@dataclass(frozen=True)
class Occupancy:
    """Resident warps (NVIDIA, per SM) or waves (AMD, per SIMD), the fraction of the maximum, the limiter."""

    arch: str
    unit: str  # "warps/SM" | "waves/SIMD"
    active: float  # warps per SM or waves per SIMD
    max_active: int
    blocks_per_sm: int  # resident blocks per SM (NVIDIA) or workgroups per CU/WGP (AMD)
    limiter: str  # "registers" | "shared" | "warps" | "blocks" | "none" | "does-not-fit"

    @property
    def fraction(self) -> float:
        return self.active / self.max_active if self.max_active else 0.0

    def as_dict(self) -> dict:
        return asdict(self) | {"fraction": self.fraction}


def _roundup(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check(name: str, value: int, lo: int = 0) -> None:
    if not isinstance(value, int) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


def occupancy(arch: Arch | str, *, threads_per_block: int, regs_per_thread: int, shared_bytes: int = 0,
              static_shared_bytes: int = 0, sgprs: int = 0) -> Occupancy:
    """Theoretical occupancy of one kernel on `arch` (see the module docstring for the rules).

    regs_per_thread: NVIDIA registers per thread; AMD ``.vgpr_count`` (unified VGPR+AGPR on CDNA).
    shared_bytes: dynamic shared memory / LDS per block (Triton's ``metadata.shared``).
    static_shared_bytes: static shared memory in the binary (cubin SHARED, AMD group segment).
    sgprs: AMD scalar registers per wave (limits occupancy on CDNA only).
    """
    a = get_arch(arch) if isinstance(arch, str) else arch
    _check("threads_per_block", threads_per_block, 1)
    _check("regs_per_thread", regs_per_thread)
    _check("shared_bytes", shared_bytes)
    _check("static_shared_bytes", static_shared_bytes)
    _check("sgprs", sgprs)
    if a.family in ("nvidia", "cpu"):
        return _nvidia(a, threads_per_block, regs_per_thread, shared_bytes, static_shared_bytes)
    return _amd(a, threads_per_block, regs_per_thread, shared_bytes + static_shared_bytes, sgprs)


def _pick(limits: dict[str, int]) -> tuple[int, str]:
    """The smallest limit and its name. Ties go to the first listed, so a kernel that reaches the
    hardware's warp or block maximum is reported as limited by it, not by a resource that also allows it."""
    name = min(limits, key=lambda k: limits[k])
    return limits[name], name


def _nvidia(a: Arch, threads: int, regs: int, dynamic_smem: int, static_smem: int) -> Occupancy:
    warps = _cdiv(threads, a.warp_size)
    none = Occupancy(a.name, "warps/SM", 0, a.max_warps_per_sm, 0, "does-not-fit")
    smem = _roundup(dynamic_smem + max(static_smem, a.reserved_shared_mem_per_block), a.shared_mem_alloc_unit)
    if (threads > a.max_threads_per_block or regs > a.regs_per_thread_max
            or smem > a.shared_mem_per_block + a.reserved_shared_mem_per_block):
        return none
    regs_per_warp = _roundup(max(regs, 1) * a.warp_size, a.reg_alloc_unit)
    if regs_per_warp * _roundup(warps, a.reg_subpartitions) > a.regs_per_sm:
        return none
    warps_by_regs = (a.regs_per_sm // a.reg_subpartitions) // regs_per_warp * a.reg_subpartitions
    limits = {
        "warps": a.max_warps_per_sm // warps,
        "blocks": a.max_blocks_per_sm,
        "registers": warps_by_regs // warps,
        "shared": a.shared_mem_per_sm // smem if smem else a.max_blocks_per_sm,
    }
    blocks, limiter = _pick(limits)
    if blocks == 0:
        return none
    return Occupancy(a.name, "warps/SM", blocks * warps, a.max_warps_per_sm, blocks, limiter)


def _cdna_sgpr_waves(sgprs: int) -> int:
    if sgprs <= 80:
        return 10
    if sgprs <= 88:
        return 9
    if sgprs <= 100:
        return 8
    return 7


def _amd(a: Arch, threads: int, vgprs: int, lds: int, sgprs: int) -> Occupancy:
    waves_per_wg = _cdiv(threads, a.warp_size)
    none = Occupancy(a.name, "waves/SIMD", 0, a.max_warps_per_sm, 0, "does-not-fit")
    if threads > a.max_threads_per_block or vgprs > a.regs_per_thread_max or lds > a.shared_mem_per_block:
        return none
    if vgprs < a.reg_alloc_unit:
        waves_regs = a.max_warps_per_sm
    else:
        waves_regs = min(max(a.regs_per_sm // _roundup(vgprs, a.reg_alloc_unit), 1), a.max_warps_per_sm)
    if a.family == "amd-cdna" and sgprs:
        waves_regs = min(waves_regs, _cdna_sgpr_waves(sgprs))
    slots = a.max_warps_per_sm * a.simds_per_cu // waves_per_wg
    lds_alloc = _roundup(lds, a.shared_mem_alloc_unit)
    limits = {
        "warps": slots,
        "blocks": slots if waves_per_wg == 1 else a.max_blocks_per_sm,
        "registers": waves_regs * a.simds_per_cu // waves_per_wg,
        "shared": a.shared_mem_per_sm // lds_alloc if lds_alloc else slots,
    }
    wgs, limiter = _pick(limits)
    if wgs == 0:
        return none
    active = min(waves_regs, wgs * waves_per_wg / a.simds_per_cu)
    return Occupancy(a.name, "waves/SIMD", active, a.max_warps_per_sm, wgs, limiter)
