"""Kernel variants that ``wavefront inspect`` compiles beside an op's default launches: kernels that no default
dispatch reaches (opt-in, or not yet run on a GPU) but whose machine code is part of the record.

A variant names its op, the targets it is planned for, the cases it covers, and a function that launches it
on an op's inputs (recorded without executing, as the op's own launches are; see ``static.capture``). Its
rows sit beside the op's rows under the same op/mode/case with the variant kernel's own name, so every
existing row is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from wavefront.kernels import attention_fa3, attention_gluon
from wavefront.kernels._launch import Launch, recording
from wavefront.ops._spec import Case, OpInputs, OpSpec
from wavefront.workbench.static.capture import NoCompute, _triton_path, seed


@dataclass(frozen=True)
class Variant:
    op: str
    name: str
    mode: str
    targets: tuple[str, ...]
    covers: Callable[[Case], bool]
    run: Callable[[OpInputs], object]


def _gluon_attention_covers(case: Case) -> bool:
    # The fused-FP8-output cases are the plain forward plus an epilogue the Gluon kernel does not have.
    return (case.dims.get("head_dim") in attention_gluon.HEAD_DIMS and "seqlens" not in case.options
            and "quantize" not in case.options)


def _gluon_attention_run(inputs: OpInputs):
    q, k, v = inputs.args
    scale = inputs.kwargs.get("scale") or q.shape[-1] ** -0.5
    return attention_gluon.attention_fwd(q, k, v, bool(inputs.kwargs.get("causal", False)), scale)


def _fa3_attention_run(inputs: OpInputs):
    q, k, v = inputs.args
    scale = inputs.kwargs.get("scale") or q.shape[-1] ** -0.5
    return attention_fa3.attention_fwd(q, k, v, bool(inputs.kwargs.get("causal", False)), scale)


VARIANTS: tuple[Variant, ...] = (
    # The Gluon attention forward: compiled and read, never run here (kernels/attention_gluon.py).
    Variant("attention", "gluon_sm90", "fwd", ("sm_90",), _gluon_attention_covers, _gluon_attention_run),
    # The FA3-schedule forward (warp-specialized, ping-pong, persistent; kernels/attention_fa3.py): same cover.
    Variant("attention", "fa3_sm90", "fwd", ("sm_90",), _gluon_attention_covers, _fa3_attention_run),
)


def variants_for(spec: OpSpec, target: str, case: Case) -> list[Variant]:
    return [v for v in VARIANTS if v.op == spec.name and target in v.targets and v.covers(case)]


def capture_variant(spec: OpSpec, case: Case, dtype: torch.dtype, variant: Variant) -> list[Launch]:
    """The launches of `variant` on `spec`'s inputs for `case`, recorded without executing (cheap inputs).
    A variant whose launcher refuses the inputs (a ValueError: a dtype or layout it does not take) adds no row."""
    gen = torch.Generator().manual_seed(seed(spec.name, case.name, dtype))
    with _triton_path(), NoCompute():
        inputs = spec.make_inputs(case, dtype, torch.device("cpu"), gen)
        with recording(execute=False) as launches:
            try:
                variant.run(inputs)
            except ValueError:
                return []
    return launches
