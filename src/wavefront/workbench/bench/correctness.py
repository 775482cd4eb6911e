"""Correctness of a registered op on one case: ours and eager PyTorch against the float64 reference.

For every output (forward) and every input gradient (backward, with the same random upstream gradient
for all three), the max absolute error of ours and of eager (the op's eager function at the input
dtype) against the reference on float64 copies of the same inputs is measured, and the op's
:class:`~wavefront.ops._spec.Tolerance` decides pass or fail. Tests and ``wavefront bench`` both call
:func:`check_case`, so the rule lives in one place.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch

from wavefront import runtime
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case, OpSpec, dtype_name


@dataclass(frozen=True)
class TensorCheck:
    what: str  # "out0", "out1", "grad:x", ...
    mode: str  # "fwd" | "bwd"
    err_ours: float
    err_eager: float
    bound: float
    ref_absmax: float

    @property
    def passed(self) -> bool:
        return self.err_ours <= self.bound


@dataclass
class CaseCheck:
    op: str
    case: str
    reason: str
    dtype: str
    device: str
    backend: str
    checks: list[TensorCheck] = field(default_factory=list)
    error: str | None = None
    wall_s: float = 0.0  # CPU interpreter: not a performance figure

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)

    def worst(self, mode: str) -> TensorCheck | None:
        """The check in `mode` closest to (or furthest past) its bound."""
        cs = [c for c in self.checks if c.mode == mode]
        return max(cs, key=lambda c: c.err_ours / c.bound if c.bound > 0 else float("inf"), default=None)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        for c, cd in zip(self.checks, d["checks"], strict=True):
            cd["passed"] = c.passed
        return d


def _seed(op: str, case: str, dtype: torch.dtype) -> int:
    return zlib.crc32(f"{op}/{case}/{dtype}".encode())


def _max_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a64 = a.detach().to(torch.float64)
    if a64.shape != ref.shape:
        raise ValueError(f"shape {tuple(a64.shape)} differs from the reference's {tuple(ref.shape)}")
    if a64.numel() == 0:
        return 0.0
    both_nan = torch.isnan(a64) & torch.isnan(ref)
    diff = torch.where(both_nan, torch.zeros_like(a64), (a64 - ref).abs())
    if torch.isnan(diff).any():
        return float("inf")
    return float(diff.max())


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple | list) else (out,)


def _clone_args(args, kwargs, grad_argnums, to64: bool):
    """Fresh leaf copies (float64 if to64) of the floating tensors; grad args require grad."""

    def conv(a, needs_grad):
        if not isinstance(a, torch.Tensor):
            return a
        t = a.detach()
        if to64 and t.is_floating_point():
            t = t.to(torch.float64)
        elif not to64:
            t = t.clone() if t.is_contiguous() else t.detach()
        return t.requires_grad_(needs_grad)

    new_args = tuple(conv(a, i in grad_argnums) for i, a in enumerate(args))
    new_kwargs = {k: conv(v, False) for k, v in kwargs.items()}
    return new_args, new_kwargs


def check_case(spec: OpSpec, case: Case, dtype: torch.dtype, device: str | torch.device = "cpu",
               backward: bool = True) -> CaseCheck:
    """Run ours, eager and the float64 reference on one case; see the module docstring."""
    device = torch.device(device)
    result = CaseCheck(spec.name, case.name, case.reason, dtype_name(dtype), str(device),
                       runtime.backend(device))
    gen = torch.Generator().manual_seed(_seed(spec.name, case.name, dtype))
    t0 = time.perf_counter()
    try:
        inputs = spec.make_inputs(case, dtype, device, gen)
        grad_argnums = inputs.grad_argnums if (backward and spec.has_backward) else ()
        ours_args, ours_kw = _clone_args(inputs.args, inputs.kwargs, grad_argnums, to64=False)
        eager_args, eager_kw = _clone_args(inputs.args, inputs.kwargs, grad_argnums, to64=False)
        ref_args, ref_kw = _clone_args(inputs.args, inputs.kwargs, grad_argnums, to64=True)

        out_ours = _as_tuple(spec.fn(*ours_args, **ours_kw))
        out_eager = _as_tuple(spec.eager_fn(*eager_args, **eager_kw))
        out_ref = _as_tuple(spec.reference(*ref_args, **ref_kw))
        tol = spec.tolerance
        float_outs = [i for i, o in enumerate(out_ref) if isinstance(o, torch.Tensor) and o.is_floating_point()]
        for i in float_outs:
            ref = out_ref[i].detach()
            ref_max = float(ref.abs().max()) if ref.numel() else 0.0
            e_eager = _max_err(out_eager[i], ref)
            result.checks.append(TensorCheck(f"out{i}", "fwd", _max_err(out_ours[i], ref), e_eager,
                                             tol.bound(e_eager, ref_max, dtype), ref_max))
        if grad_argnums:
            dys = [torch.randn(out_ref[i].shape, generator=gen).to(dtype=dtype, device=device) for i in float_outs]
            diff_outs = [i for i in float_outs if out_ours[i].requires_grad]
            dys = [dys[float_outs.index(i)] for i in diff_outs]
            grads = {}
            runs = (("ours", out_ours, ours_args, False), ("eager", out_eager, eager_args, False),
                    ("ref", out_ref, ref_args, True))
            for name, outs, args, cast in runs:
                targets = [args[i] for i in grad_argnums]
                upstream = [dy.to(torch.float64) if cast else dy for dy in dys]
                grads[name] = torch.autograd.grad([outs[i] for i in diff_outs], targets, upstream, allow_unused=True)
            for k, argnum in enumerate(grad_argnums):
                ref = grads["ref"][k]
                if ref is None:
                    continue
                ref_max = float(ref.abs().max()) if ref.numel() else 0.0
                e_eager = _max_err(grads["eager"][k], ref)
                ours = grads["ours"][k]
                e_ours = float("inf") if ours is None else _max_err(ours, ref)
                result.checks.append(TensorCheck(f"grad:arg{argnum}", "bwd", e_ours, e_eager,
                                                 tol.bound(e_eager, ref_max, dtype), ref_max))
    except Exception as exc:  # a failing case is reported, and the run goes on
        result.error = f"{type(exc).__name__}: {exc}"
    result.wall_s = time.perf_counter() - t0
    return result


def iter_checks(ops: Iterable[str] | None = None, dtypes: Iterable[torch.dtype] | None = None,
                device: str = "cpu", include_slow: bool = False, backward: bool = True):
    """Yield (spec, case, dtype) triples to check: the whole registry unless narrowed."""
    names = list(ops) if ops else list(REGISTRY)
    for name in names:
        spec = REGISTRY[name]
        for case in spec.cases:
            if case.slow and not include_slow:
                continue
            for dtype in dtypes or spec.dtypes:
                yield spec, case, dtype
