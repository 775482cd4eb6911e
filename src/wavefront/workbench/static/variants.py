"""Kernel variants that ``wavefront inspect`` compiles beside an op's default launches: kernels that no default
dispatch reaches (opt-in, or not yet run on a GPU) but whose machine code is part of the record.

A variant names its op, the targets it is planned for, the cases it covers, and a function that launches it
on an op's inputs (recorded without executing, as the op's own launches are; see ``static.capture``). Its
rows sit beside the op's rows under the same op/mode/case with the variant kernel's own name, so every
existing row is unchanged. A variant that runs the op itself with an opt-in switched on names the kernels that
are its own (``kernels``): the op's other launches (quantization, say) are its default rows already.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from wavefront import ops
from wavefront.kernels import attention as attention_kernels
from wavefront.kernels import attention_bwd_gluon, attention_fa3, attention_gluon
from wavefront.kernels import linear_fp8 as fp8_kernels
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
    #: the kernels whose launches are this variant's rows; empty: every launch of ``run``
    kernels: tuple[str, ...] = ()
    #: the interpreter runs it (its own tests), so the GPU configurations do not list it as unrun
    interpreted: bool = False


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


def _gluon_attention_bwd_run(inputs: OpInputs):
    # The backward as a user with the flag gets it (the Gluon dK/dV kernel, the Triton delta and dQ passes,
    # which are the op's own rows); dO, O and lse2 are stand-ins of the right shapes: nothing executes.
    q, k, v = inputs.args
    scale = inputs.kwargs.get("scale") or q.shape[-1] ** -0.5
    lse2 = torch.empty(q.shape[:3], dtype=torch.float32)
    with _env(attention_bwd_gluon.ENV_FLAG, "1"):
        return attention_kernels.attention_bwd(torch.empty_like(q), q, k, v, torch.empty_like(q), lse2,
                                               bool(inputs.kwargs.get("causal", False)), scale)


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _fp8_tma_run(inputs: OpInputs):
    # The op's forward as a user with the flag gets it: every recipe's product on the TMA kernel of its scale form
    # (the flag makes the auto provider ours for tensorwise and rowwise too); its quantize launches are filtered
    # out.
    with _env(fp8_kernels.TMA_ENV_FLAG, "1"):
        return ops.linear_fp8(*inputs.args, **inputs.kwargs)


VARIANTS: tuple[Variant, ...] = (
    # The Gluon attention forward: compiled and read, never run here (kernels/attention_gluon.py).
    Variant("attention", "gluon_sm90", "fwd", ("sm_90",), _gluon_attention_covers, _gluon_attention_run),
    # The FA3-schedule forward (warp-specialized, ping-pong, persistent; kernels/attention_fa3.py): same cover.
    Variant("attention", "fa3_sm90", "fwd", ("sm_90",), _gluon_attention_covers, _fa3_attention_run),
    # The Gluon sm_100 dK/dV backward (WAVEFRONT_ATTENTION_BWD_GLUON=1, kernels/attention_bwd_gluon.py): opt-in,
    # never run on a GPU (Gluon has no interpreter); its row shows the 4 barriers per iteration.
    Variant("attention", "gluon_sm100_bwd", "bwd", ("sm_100",), _gluon_attention_covers, _gluon_attention_bwd_run,
            kernels=("_attn_bwd_dkdv_sm100_gluon",)),
    # The FP8 GEMMs on the persistent, warp-specialized TMA kernel (WAVEFRONT_FP8_TMA=1, kernels/linear_fp8.py):
    # the forward product of every bench recipe. Opt-in until a GPU run proves it; the interpreter runs it
    # (tests/ops/test_linear_fp8_tma.py).
    Variant("linear_fp8", "fp8_tma", "fwd", ("sm_90", "sm_100"), lambda case: True, _fp8_tma_run,
            kernels=fp8_kernels.TMA_KERNELS, interpreted=True),
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
    return [la for la in launches if not variant.kernels or la.name in variant.kernels]
