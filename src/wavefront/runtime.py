"""What machine we are on: backend, architecture, lane width and per-architecture launch limits.

This is the one module that knows the hardware. Kernels and launchers never hardcode 32 lanes: they ask
for ``arch().warp_size`` and clamp ``num_warps`` with :func:`clamp_num_warps`.

Backends:

- ``cuda``             an NVIDIA GPU through Triton's compiled path;
- ``hip``              an AMD GPU (ROCm) through Triton's compiled path;
- ``cpu-interpreter``  CPU tensors, kernels run under the Triton interpreter (``TRITON_INTERPRET=1``
                       must be set before the first kernel module is imported);
- ``cpu-reference``    CPU tensors without the interpreter: ops run their PyTorch reference.

The architecture table (:data:`ARCHS`) is pure data, usable without a GPU: the inspect tool uses it for
occupancy of ahead-of-time compiled kernels, and the launch-config functions take an :class:`Arch` so
they can be tested as pure functions on any machine.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import platform
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Literal

Backend = Literal["cuda", "hip", "cpu-interpreter", "cpu-reference"]
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
_NV = dict(family="nvidia", warp_size=32, max_threads_per_block=1024, regs_per_thread_max=255,
           max_warps_per_sm=64, max_blocks_per_sm=32, regs_per_sm=65_536, reg_alloc_unit=256,
           shared_mem_alloc_unit=128, reserved_shared_mem_per_block=1024, reg_subpartitions=4)
_CDNA = dict(family="amd-cdna", warp_size=64, max_threads_per_block=1024, shared_mem_per_block=65_536,
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


def interpreting() -> bool:
    """True when Triton kernels run under the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _gpu_kind() -> Literal["cuda", "hip", None]:
    import torch

    if not torch.cuda.is_available():
        return None
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


def backend(device=None) -> Backend:
    """The backend that runs ops on `device` (a torch.device, a string, or None for the default)."""
    import torch

    dev = torch.device(device) if device is not None else None
    if dev is None:
        kind = _gpu_kind()
        if kind is not None and not interpreting():
            return kind
    elif dev.type == "cuda":
        kind = _gpu_kind()
        if kind is None:
            raise RuntimeError("a CUDA device was requested but torch sees no GPU")
        return kind
    elif dev.type != "cpu":
        raise ValueError(f"unsupported device type {dev.type!r}: expected cuda (NVIDIA or ROCm) or cpu")
    return "cpu-interpreter" if interpreting() else "cpu-reference"


class ReferenceFallbackWarning(UserWarning):
    """CPU tensors run the PyTorch reference because the Triton interpreter was not enabled."""


_WARNED_FALLBACK = False


def uses_triton(device) -> bool:
    """Whether an op on `device` runs its Triton kernel (compiled or interpreted).

    The first time a CPU tensor falls back to the PyTorch reference in a process, a
    :class:`ReferenceFallbackWarning` says so and names the fix (once: later calls are silent).
    """
    global _WARNED_FALLBACK
    if backend(device) != "cpu-reference":
        return True
    if not _WARNED_FALLBACK:
        _WARNED_FALLBACK = True
        warnings.warn("wavefront: CPU tensors run the PyTorch reference, not the Triton kernels: set "
                      "TRITON_INTERPRET=1 in the environment before importing wavefront to run the kernels under "
                      "the Triton interpreter (slow, for testing); on a GPU the kernels run compiled",
                      ReferenceFallbackWarning, stacklevel=3)
    return False


@functools.cache
def _device_arch_name(index: int) -> str:
    import torch

    props = torch.cuda.get_device_properties(index)
    if _gpu_kind() == "hip":
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


_ASSUMED: contextvars.ContextVar[tuple[Arch, int] | None] = contextvars.ContextVar("wavefront_assumed_target",
                                                                                 default=None)


@contextlib.contextmanager
def assume_target(arch_name: str, n_sms: int) -> Iterator[None]:
    """Inside the block, :func:`arch` and :func:`sm_count` answer for compile target `arch_name` with
    `n_sms` SMs/CUs, whatever the device.

    Launchers then choose the launch configuration that target would get, which is what the inspect tool
    records (with ``recording(execute=False)``) and compiles ahead of time. Nothing runs on the target.
    """
    if n_sms < 1:
        raise ValueError(f"n_sms must be >= 1, got {n_sms}")
    token = _ASSUMED.set((get_arch(arch_name), int(n_sms)))
    try:
        yield
    finally:
        _ASSUMED.reset(token)


def arch(device=None) -> Arch:
    """Limits of the architecture that runs ops on `device`.

    A GPU architecture missing from :data:`ARCHS` borrows the limits of its family's closest entry
    (NVIDIA: the newest not newer than it; AMD: gfx942 for CDNA, gfx1100 for RDNA), keeping its own name.
    """
    import torch

    assumed = _ASSUMED.get()
    if assumed is not None:
        return assumed[0]
    b = backend(device)
    if b.startswith("cpu"):
        return ARCHS["cpu"]
    dev = torch.device(device) if device is not None else torch.device("cuda")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    name = _device_arch_name(index)
    if name in ARCHS:
        return ARCHS[name]
    if b == "hip":
        base = ARCHS["gfx1100"] if name.startswith("gfx1") else ARCHS["gfx942"]
    else:
        cc = int(name.removeprefix("sm_").rstrip("a"))
        nvidia = sorted((int(k[3:]), k) for k, a in ARCHS.items() if a.family == "nvidia")
        base = ARCHS[max((k for c, k in nvidia if c <= cc), default="sm_80")]
    return Arch(**{**asdict(base), "name": name})


#: Programs per SM/CU that persistent launchers (row-wise backward passes) aim for.
PERSISTENT_PROGRAMS_PER_SM = 4
#: The interpreter runs programs one after another; a handful of programs still exercises every
#: cross-program reduction while keeping CPU runs short.
INTERPRETER_SM_COUNT = 2


def sm_count(device=None) -> int:
    """Streaming multiprocessors (NVIDIA) or compute units (AMD) of `device`; a small constant on CPU."""
    import torch

    assumed = _ASSUMED.get()
    if assumed is not None:
        return assumed[1]
    if backend(device).startswith("cpu"):
        return INTERPRETER_SM_COUNT
    dev = torch.device(device) if device is not None else torch.device("cuda")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_properties(index).multi_processor_count


def describe(device=None) -> dict:
    """What is in use, as a JSON-ready dict (backend, arch, lane width, versions, device name)."""
    import torch

    b = backend(device)
    a = arch(device)
    info = {
        "backend": b,
        "arch": a.name,
        "family": a.family,
        "warp_size": a.warp_size,
        "max_num_warps": a.max_num_warps,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "python": platform.python_version(),
        "host": platform.node(),
        "device_name": "cpu",
    }
    if not b.startswith("cpu"):
        info["device_name"] = torch.cuda.get_device_name()
        info["driver"] = torch.version.hip if b == "hip" else torch.version.cuda
    return info


#: Triton versions this code is tested with, [low, high): the interpreter patches (kernels/_interpreter.py)
#: and the traffic tool use private interpreter internals that may change in any minor release.
TRITON_TESTED = ((3, 3), (3, 10))


def triton_version_problem(version: str) -> str | None:
    """Why `version` is outside :data:`TRITON_TESTED` (None when inside)."""
    try:
        major_minor = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return f"wavefront: cannot read the Triton version {version!r}; tested with Triton " + _tested_range()
    low, high = TRITON_TESTED
    if low <= major_minor < high:
        return None
    return (f"wavefront: Triton {version} is outside the tested range {_tested_range()}; kernels may fail to "
            f"compile and the interpreter's rounding fixes may not apply: install a tested version, e.g. "
            f"pip install 'triton>={low[0]}.{low[1]},<{high[0]}.{high[1]}'")


def _tested_range() -> str:
    (a, b), (c, d) = TRITON_TESTED
    return f">={a}.{b},<{c}.{d}"


def check_triton_version() -> None:
    """Warn once, at the first kernel import, when the installed Triton is outside the tested range."""
    import triton

    problem = triton_version_problem(triton.__version__)
    if problem is not None:
        warnings.warn(problem, RuntimeWarning, stacklevel=2)


def _triton_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:
        return None
