"""The op registry's vocabulary: an op declared once, with everything the tools need to exercise it.

An :class:`OpSpec` carries the wavefront function, its float64-capable reference, the cases that cover
its regimes (each with the reason it exists), the FLOP and minimal-byte formulas, and the tolerance rule.
Tests, ``wavefront bench``, inspect, traffic, roofline, the gates and the report iterate the registry in
``wavefront.ops.REGISTRY``; none of them names an op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from wavefront.archs import Arch

Mode = Literal["fwd", "bwd"]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Case:
    """One input regime of an op.

    dims: the sizes the formulas and input makers read (n_rows, n_cols, ...).
    options: keyword arguments passed to the op and its reference (eps, causal, ...).
    layout: how make_inputs lays the tensors out ("contiguous", "strided", ...; op-specific).
    slow: kept out of the default test run (pytest -m slow runs it).
    targets: the GPU compile targets this case supports, where narrower than its op's (an FP8 option on an op
        that also runs on Ampere); inspect skips the others. None: the op's.
    """

    name: str
    reason: str
    dims: Mapping[str, int]
    options: Mapping[str, Any] = field(default_factory=dict)
    layout: str = "contiguous"
    slow: bool = False
    targets: Callable[[Arch], bool] | None = None

    @property
    def id(self) -> str:
        return self.name


@dataclass
class OpInputs:
    """Arguments for one call. grad_argnums: positions of the args that receive gradients."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad_argnums: tuple[int, ...]


@dataclass(frozen=True)
class Tolerance:
    """The accuracy rule, in one place.

    For each output and gradient, with ``ref`` computed in float64 from the same inputs:

        err(ours) <= factor * err(eager in the same dtype) + floor_ulps * eps(dtype) * max(|ref|)

    where err is the max absolute difference to ``ref``. The floor (one unit in the last place at the
    largest reference magnitude by default) keeps the rule meaningful where eager happens to be exact.
    """

    factor: float = 2.0
    floor_ulps: float = 1.0

    def bound(self, eager_err: float, ref_absmax: float, dtype: torch.dtype) -> float:
        eps = torch.finfo(dtype).eps
        return self.factor * eager_err + self.floor_ulps * eps * max(ref_absmax, 1.0)


@dataclass(frozen=True)
class OpSpec:
    """An op, declared once.

    fn: the wavefront function.
    reference: plain PyTorch, same signature, exact when called on float64 inputs.
    make_inputs: (case, dtype, device, generator) -> OpInputs; random data, never zeros.
    cases: correctness regimes (small; some marked slow).
    bench_cases: representative shapes from real models (wavefront.shapes), for timing and inspection.
    flops: (case, mode) -> floating-point operations of one call in that mode.
    min_bytes: (case, dtype, mode) -> bytes that must cross HBM at least once (each input read once,
        each output written once).
    eager: what a user would run in eager PyTorch at the input dtype; defaults to the reference.
    """

    name: str
    fn: Callable[..., Any]
    reference: Callable[..., Any]
    make_inputs: Callable[[Case, torch.dtype, torch.device, torch.Generator], OpInputs]
    cases: Sequence[Case]
    bench_cases: Sequence[Case]
    flops: Callable[[Case, Mode], float]
    min_bytes: Callable[[Case, torch.dtype, Mode], int]
    eager: Callable[..., Any] | None = None
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    tolerance: Tolerance = Tolerance()
    has_backward: bool = True
    description: str = ""
    # The GPU compile targets the op supports (inspect skips the others); None: every target.
    targets: Callable[[Arch], bool] | None = None

    @property
    def eager_fn(self) -> Callable[..., Any]:
        return self.eager if self.eager is not None else self.reference

    def supports(self, case: Case, arch: Arch) -> bool:
        """Whether `case` of this op compiles for `arch` (the op's and the case's `targets`; None: every one)."""
        return ((self.targets is None or self.targets(arch))
                and (case.targets is None or case.targets(arch)))


_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype) -> str:
    """Short dtype name used in ids, tables and JSON: fp32, bf16, fp16, fp64."""
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize
