"""What machine we are on: backend, architecture, lane width and per-architecture launch limits.

This is the one module that knows the hardware. Kernels and launchers never hardcode 32 lanes: they ask
for ``arch().warp_size`` and clamp ``num_warps`` with :func:`clamp_num_warps`.

Backends:

- ``cuda``             an NVIDIA GPU through Triton's compiled path;
- ``hip``              an AMD GPU (ROCm) through Triton's compiled path;
- ``cpu-interpreter``  CPU tensors, kernels run under the Triton interpreter (``TRITON_INTERPRET=1``
                       must be set before the first kernel module is imported);
- ``cpu-reference``    CPU tensors without the interpreter: ops run their PyTorch reference.

The architecture table (:data:`ARCHS`) lives in :mod:`wavefront.archs` as pure data, usable without a
GPU, torch or Triton; it is re-exported here.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import platform
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from importlib import metadata
from typing import Literal

from wavefront.archs import (  # noqa: F401  (re-exported: the runtime's public face)
    ARCHS,
    DEFAULT_TARGETS,
    Arch,
    Family,
    clamp_num_warps,
    get_arch,
)

Backend = Literal["cuda", "hip", "cpu-interpreter", "cpu-reference"]


def interpreting() -> bool:
    """True when Triton kernels run under the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _gpu_kind() -> Literal["cuda", "hip", None]:
    import torch  # lazy: torch-free import

    if not torch.cuda.is_available():
        return None
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


def backend(device=None) -> Backend:
    """The backend that runs ops on `device` (a torch.device, a string, or None for the default)."""
    import torch  # lazy: torch-free import

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
    import torch  # lazy: torch-free import

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
    import torch  # lazy: torch-free import

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
    import torch  # lazy: torch-free import

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
    import torch  # lazy: torch-free import

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
    import triton  # lazy: Triton-free import

    problem = triton_version_problem(triton.__version__)
    if problem is not None:
        warnings.warn(problem, RuntimeWarning, stacklevel=2)


def _triton_version() -> str | None:
    try:
        return metadata.version("triton")
    except Exception:
        return None
