"""The one door through which every launcher starts a Triton kernel.

Launchers call :func:`launch` instead of ``kernel[grid](...)``. Besides launching, it can record what
would be launched (kernel, grid, argument types and values, constexprs, launch options) so that tools can
see each op's kernels at the exact specialization its real arguments produce, without a GPU:

    with recording() as launches:          # record and launch
        wavefront.ops.rms_norm(x, w)
    with recording(execute=False) as launches:   # record only: no kernel runs, outputs stay uninitialised
        ...

The inspect tool compiles the recorded launches ahead of time for GPU targets; the traffic tool runs them
under an instrumented interpreter.

Public API (the workbench and any new kernel build on it; names outside ``__all__`` are private):

- ``launch(kernel, grid, *, constexprs, options, **runtime_args)``: launch (or record) a ``@triton.jit``
  kernel. Runtime arguments are given by name and checked against the kernel's signature (an unknown,
  missing or twice-given name is a ``TypeError`` before anything runs); positional arguments in signature
  order are still accepted. ``constexprs`` holds the ``tl.constexpr`` parameters, ``options`` the launch
  options (``num_warps``, ``num_stages``, backend extras). Under the interpreter the launch runs inside
  :func:`wavefront.kernels._interpreter.gpu_rounding` (GPU rounding for this launch only), and under memcheck
  when ``WAVEFRONT_MEMCHECK`` asks for it (:mod:`wavefront.kernels._memcheck`).
- ``recording(execute=True)``: a context manager yielding the list of :class:`Launch` records made inside it;
  ``execute=False`` records without launching.
- ``op_scope(name)``: labels the launches made inside it with the op they belong to (``Launch.op``).
- ``Launch`` (kernel, grid, args in signature order with tensors as :class:`TensorArg`, constexprs, options,
  op, ``name``) and ``TensorArg`` (dtype, shape, stride, data_ptr, device, ``aligned16``): the record.
- ``bind_runtime_args(kernel, args, named, constexprs)``: the argument check on its own, for tools that
  replay a launch.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._interpreter import gpu_rounding
from wavefront.kernels._memcheck import install_from_env
from wavefront.kernels._scope import _OP, op_scope

runtime.check_triton_version()

__all__ = ["Launch", "TensorArg", "bind_runtime_args", "launch", "op_scope", "recording", "register_cache",
           "reset_caches"]


@dataclass(frozen=True)
class TensorArg:
    """What a kernel's pointer argument carries into specialization: dtype, alignment, shape, strides."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    data_ptr: int
    device: str

    @property
    def aligned16(self) -> bool:
        return self.data_ptr % 16 == 0


@dataclass(frozen=True)
class Launch:
    kernel: Any  # the @triton.jit function
    grid: tuple[int, ...]
    args: tuple[Any, ...]  # positional runtime args; tensors become TensorArg, None stays None
    constexprs: Mapping[str, Any]
    options: Mapping[str, Any]  # num_warps, num_stages, and backend extras (waves_per_eu, ...)
    op: str = ""  # the op that launched it, when known

    @property
    def name(self) -> str:
        fn = getattr(self.kernel, "fn", self.kernel)
        return getattr(fn, "__name__", str(fn))


@dataclass
class _Recorder:
    execute: bool
    launches: list[Launch] = field(default_factory=list)


_RECORDER: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("wavefront_recorder", default=None)


@contextlib.contextmanager
def recording(execute: bool = True) -> Iterator[list[Launch]]:
    """Record every launch made inside the block; with execute=False, launch nothing."""
    rec = _Recorder(execute=execute)
    token = _RECORDER.set(rec)
    try:
        yield rec.launches
    finally:
        _RECORDER.reset(token)


def _describe(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return TensorArg(arg.dtype, tuple(arg.shape), tuple(arg.stride()), arg.data_ptr(), str(arg.device))
    return arg


@functools.cache
def _runtime_params(kernel) -> tuple[str, ...]:
    """The kernel's non-constexpr parameter names, in signature order (compiled or interpreted kernel)."""
    fn = getattr(kernel, "fn", None)
    if fn is None or not hasattr(kernel, "arg_names"):
        raise TypeError(f"launch: {kernel!r} is not a @triton.jit function")
    names = []
    for param in inspect.signature(fn).parameters.values():
        annotation = param.annotation
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        if annotation is tl.constexpr or text.endswith("constexpr"):
            continue
        names.append(param.name)
    return tuple(names)


def bind_runtime_args(kernel, args: tuple[Any, ...], named: Mapping[str, Any],
                      constexprs: Mapping[str, Any]) -> tuple[Any, ...]:
    """Order positional and named runtime arguments by the kernel's signature; refuse any mismatch.

    Naming each runtime argument (``x_ptr=x, stride_x_row=x.stride(0)``) makes a swapped stride an error
    here instead of silently wrong numbers under the interpreter or on a GPU.
    """
    names = _runtime_params(kernel)
    if len(args) > len(names):
        raise TypeError(f"launch: {len(args)} positional arguments for {len(names)} runtime parameters of "
                        f"{_name(kernel)}")
    bound = dict(zip(names, args, strict=False))
    for key, value in named.items():
        if key in constexprs:
            raise TypeError(f"launch: {key!r} given both as a runtime argument and a constexpr")
        if key not in names:
            raise TypeError(f"launch: {_name(kernel)} has no runtime parameter {key!r} "
                            f"(runtime parameters: {', '.join(names)})")
        if key in bound:
            raise TypeError(f"launch: {key!r} given twice (positionally and by name)")
        bound[key] = value
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f"launch: {_name(kernel)} is missing runtime arguments {', '.join(missing)}")
    return tuple(bound[n] for n in names)


def _name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", str(fn))


def launch(kernel, grid: tuple[int, ...], *args: Any, constexprs: Mapping[str, Any],
           options: Mapping[str, Any], **named: Any) -> None:
    """Launch `kernel` on `grid` (or record it; see module docstring).

    Runtime arguments are given by name (preferred: checked against the kernel's signature) or
    positionally in signature order; constexprs and launch options are separate mappings.
    """
    grid = tuple(int(g) for g in grid)
    if any(g <= 0 for g in grid):
        raise ValueError(f"grid must be positive in every dimension, got {grid}")
    args = bind_runtime_args(kernel, args, named, constexprs)
    rec = _RECORDER.get()
    if rec is not None:
        rec.launches.append(Launch(kernel, grid, tuple(_describe(a) for a in args), dict(constexprs),
                                   dict(options), _OP.get()))
        if not rec.execute:
            return
    if runtime.interpreting():
        install_from_env()  # WAVEFRONT_MEMCHECK: check this and every later interpreted launch
        with gpu_rounding():
            kernel[grid](*args, **constexprs, **options)
    else:
        kernel[grid](*args, **constexprs, **options)


_CACHE_RESETS: list[Callable[[], None]] = []


def register_cache(reset: Callable[[], None]) -> Callable[[], None]:
    """Register the reset of a launcher-side cache (e.g. AdamW's device-resident tensor tables), so that
    tools measuring one case at a time (traffic) start every case cold: what a cache hit saves depends on
    which addresses the allocator happened to reuse from the previous case."""
    _CACHE_RESETS.append(reset)
    return reset


def reset_caches() -> None:
    """Empty every registered launcher-side cache."""
    for reset in _CACHE_RESETS:
        reset()


def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_descriptor_allocator(device: torch.device | None = None) -> None:
    """Tensor descriptors made inside a kernel (TMA) need a little global scratch per program; Triton asks the
    allocator set with ``triton.set_allocator``. Set ours on the first CUDA launch that needs it, unless the
    application set one. Nothing to do under the interpreter or on another device."""
    import triton  # lazy: Triton-free import
    from triton.runtime import _allocation  # lazy: Triton-free import

    if runtime.interpreting() or (device is not None and device.type != "cuda"):
        return
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_descriptor_scratch)
