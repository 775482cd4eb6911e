"""Capture the kernel launches of a registered op, forward and backward, at one case.

Every launcher goes through ``wavefront.kernels._launch.launch``, so ``recording()`` sees each launch with
its grid, arguments (tensors as dtype/shape/stride/pointer), constexprs and options. This module drives an
op the way a user would (forward, then backward through autograd with a random upstream gradient) and
returns the launches of each mode. Inspect records without executing; traffic executes under the
instrumented interpreter.

Cheap inputs at benchmark shapes: a bench case can be 32768 x 4096 (256 MiB in bf16). For recording only
the specialization matters (dtypes, strides, sizes, pointer alignment), never the data, so
:class:`NoCompute` runs the input maker and the op's surrounding PyTorch code with every aten op
evaluated on the meta device and answered with an uninitialised CPU tensor of the same shape and
strides: nothing is computed and untouched pages cost no memory. Custom ops (``wavefront::*``) run their
real implementation, so their kernel launchers record exactly as on a real call.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from wavefront import runtime
from wavefront.kernels._launch import Launch, recording
from wavefront.ops._spec import Case, OpSpec

MODES = ("fwd", "bwd")


def op_modes(spec: OpSpec) -> tuple[str, ...]:
    return MODES if spec.has_backward else ("fwd",)


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    if isinstance(x, torch.Generator):
        return None
    return x


def _to_real(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")
    return x


#: Where a dispatch mode sends a custom op to run its real (CPU) implementation without the op coming
#: back through the mode's Python key (torch's OpOverload.redispatch).
BELOW_PYTHON_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


class NoCompute(TorchDispatchMode):
    """Shapes without arithmetic: aten ops run on meta tensors and return uninitialised CPU tensors.

    In-place and out= ops return their (real) mutated argument. Non-aten ops (the ``wavefront::`` custom
    ops) run their real implementation, whose own aten calls come back through this mode.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "aten":
            # The real implementation (below the Python dispatch key, so it does not come back here),
            # with this mode active again so the op's own PyTorch code stays arithmetic-free.
            with self:
                return func.redispatch(BELOW_PYTHON_KEYS, *args, **kwargs)
        meta_args, meta_kwargs = tree_map(_to_meta, args), tree_map(_to_meta, kwargs)
        if "device" in meta_kwargs:
            meta_kwargs["device"] = torch.device("meta")
        out = func(*meta_args, **meta_kwargs)
        schema = func._schema
        if schema.is_mutable:
            mutated = [a for a, s in zip(args, schema.arguments, strict=False)
                       if s.alias_info is not None and s.alias_info.is_write]
            mutated += [kwargs[s.name] for s in schema.arguments
                        if s.kwarg_only and s.name in kwargs and s.alias_info is not None and s.alias_info.is_write]
            if mutated:
                return mutated[0] if len(mutated) == 1 or not isinstance(out, tuple) else tuple(mutated)
        return tree_map(_to_real, out)


@contextlib.contextmanager
def _triton_path() -> Iterator[None]:
    """Make ops take their Triton path on CPU tensors while recording without executing.

    The interpreter flag decides whether an op on a CPU tensor calls its kernel launcher; with
    ``recording(execute=False)`` nothing runs, so the flag can be set for the capture on any machine.
    """
    if runtime.interpreting():
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


@dataclass
class Captured:
    """The launches of one op call, per mode, and the tensors that took part (for traffic accounting)."""

    launches: dict[str, list[Launch]]
    outputs: tuple
    inputs: tuple


def seed(op: str, case: str, dtype: torch.dtype) -> int:
    return zlib.crc32(f"{op}/{case}/{dtype}".encode())


def capture(spec: OpSpec, case: Case, dtype: torch.dtype, *, execute: bool, cheap: bool,
            modes: tuple[str, ...] | None = None) -> Captured:
    """Run `spec` forward (and backward) on `case` in `dtype` on the CPU, recording every launch.

    execute: run the kernels (traffic) or only record them (inspect).
    cheap: build inputs and run the surrounding PyTorch code without arithmetic (:class:`NoCompute`);
        only meaningful with execute=False.
    """
    if cheap and execute:
        raise ValueError("cheap inputs hold no data: use them only with execute=False")
    modes = modes or op_modes(spec)
    for m in modes:
        if m not in op_modes(spec):
            raise ValueError(f"{spec.name} has no {m!r} mode; modes: {', '.join(op_modes(spec))}")
    gen = torch.Generator().manual_seed(seed(spec.name, case.name, dtype))
    mode_ctx = NoCompute if cheap else contextlib.nullcontext
    launches: dict[str, list[Launch]] = {}
    with _triton_path() if not execute else contextlib.nullcontext(), mode_ctx():
        inputs = spec.make_inputs(case, dtype, torch.device("cpu"), gen)
        grad_argnums = inputs.grad_argnums if "bwd" in modes else ()
        args = tuple(a.detach().requires_grad_(i in grad_argnums) if isinstance(a, torch.Tensor) else a
                     for i, a in enumerate(inputs.args))
        with recording(execute=execute) as fwd:
            out = spec.fn(*args, **inputs.kwargs)
        outs = out if isinstance(out, tuple | list) else (out,)
        if "fwd" in modes:
            launches["fwd"] = fwd
        if "bwd" in modes:
            diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
            if not diff:
                raise ValueError(f"{spec.name}: no differentiable output to run the backward from")
            dys = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in diff]
            targets = [args[i] for i in grad_argnums]
            with recording(execute=execute) as bwd:
                torch.autograd.grad(diff, targets, dys, allow_unused=True)
            launches["bwd"] = bwd
    return Captured(launches, tuple(outs), args)
