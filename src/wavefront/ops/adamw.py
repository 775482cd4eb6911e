"""AdamW: the multi-tensor in-place op that ``wavefront.optim.AdamW`` runs, and a one-tensor functional
step over the same op for the registry.

``wavefront::adamw_`` updates lists of tensors in place with one launch (kernels/adamw.py): the optimizer
calls it once per dtype group. ``adamw_step`` runs it on copies of one tensor and returns them, which is
what the registry needs for its accuracy sweep, torch.compile test, inspect and traffic: one
implementation, tested by the registry, is what users run.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from wavefront import reference, runtime
from wavefront.kernels._scope import op_scope
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import check_same_device, check_shape, check_tensor

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@torch.library.custom_op("wavefront::adamw_",
                         mutates_args=("params", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "masters"))
def _adamw_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
            max_exp_avg_sqs: list[Tensor], masters: list[Tensor], scalars: Tensor, maximize: bool) -> None:
    from wavefront.kernels import adamw as kernels  # lazy: Triton-free import

    # An empty list is an absent column (the schema has no optional tensor lists).
    with op_scope("adamw"):
        kernels.adamw_multi_tensor(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs or None, masters or None,
                                   scalars, maximize=maximize)


@_adamw_.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, scalars, maximize):
    return None


def step_scalars(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: float) -> tuple:
    """The per-tensor scalars (decay, 1 - b1, b2, 1 - b2, eps, -step size, sqrt(bias correction 2)), in float64
    as torch.optim.AdamW computes them."""
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    return (1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, eps, -(lr / bias_correction1),
            bias_correction2 ** 0.5)


def adamw_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
           max_exp_avg_sqs: list[Tensor] | None, masters: list[Tensor] | None, scalars: Tensor, *,
           maximize: bool, table_key: tuple | None = None) -> None:
    """Update every tensor in place with one launch (the optimizer's dtype group): contiguous real tensors
    on one device with one dtype per list; ``scalars`` [n_tensors, 7] fp64 on the device, one row of
    :func:`step_scalars` per tensor. ``table_key``: the launcher's key of these tensors when the caller
    holds it (kernels/adamw.py ``table_key``; the tensors are then all non-empty).

    Eager calls outside any tracer take the direct path: the launcher, then one version-counter bump for
    every mutated tensor, which is what the custom op's dispatch does, minus its per-tensor Python (about
    1.5 ms of host time for Llama-3-8B's 291 tensors). torch.compile, dispatch modes (fake tensors,
    meters), the autograd profiler and grad mode see the custom op itself."""
    if (torch.compiler.is_compiling() or torch.is_grad_enabled() or is_in_torch_dispatch_mode()
            or torch.autograd._profiler_enabled()):
        torch.ops.wavefront.adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs or [], masters or [],
                                   scalars, maximize)
        return
    from wavefront.kernels import adamw as kernels  # lazy: Triton-free import

    with op_scope("adamw"):
        kernels.adamw_multi_tensor(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs or None, masters or None,
                                   scalars, maximize=maximize, key=table_key)
    mutated = [*params, *exp_avgs, *exp_avg_sqs, *(max_exp_avg_sqs or ()), *(masters or ())]
    try:
        torch.autograd.graph.increment_version(mutated)
    except TypeError:  # torch before 2.6 takes one tensor per call
        for t in mutated:
            torch.autograd.graph.increment_version(t)


def adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, lr: float, beta1: float = 0.9,
               beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2, step: int = 1,
               maximize: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """One AdamW step (torch.optim.AdamW's arithmetic, fp32 inside; fp64 for fp64) returning new (param,
    exp_avg, exp_avg_sq). ``step`` is the step number after incrementing (1 on the first step)."""
    op = "adamw_step"
    for name, t in (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        check_tensor(op, name, t, dtypes=FLOAT_DTYPES, min_dim=0)
        check_shape(op, name, t, tuple(param.shape), "the shape of 'param'")
    check_same_device(op, param=param, grad=grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    for name, value in (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("eps", eps), ("weight_decay", weight_decay),
                        ("step", step)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{op}: argument '{name}' must be a number, got {type(value).__name__}")
    if step < 1:
        raise ValueError(f"{op}: argument 'step' must be >= 1 (the count after this step), got {step}")
    kw = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, step=step, maximize=maximize)
    if param.numel() == 0 or not runtime.uses_triton(param.device):
        return reference.adamw_step_eager(param, grad, exp_avg, exp_avg_sq, **kw)
    # Fresh outputs (torch.empty_like, so the bounds test's canaries surround them), then updated in place.
    p, m, v = (torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)
               for t in (param, exp_avg, exp_avg_sq))
    scalars = torch.tensor([step_scalars(float(lr), float(beta1), float(beta2), float(eps), float(weight_decay),
                                         float(step))], dtype=torch.float64, device=param.device)
    adamw_([p], [grad.contiguous()], [m], [v], None, None, scalars, maximize=bool(maximize))
    return p, m, v


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    n = case.dims["numel"]
    opts = {"lr": 1e-3, "weight_decay": 0.01, "step": 10, **case.options}
    p = randn((n,), dtype, device, gen)
    g = randn((n,), dtype, device, gen)
    m = randn((n,), dtype, device, gen, scale=0.1)
    v = (torch.rand(n, generator=gen) * 0.01).to(device=device, dtype=dtype)
    return OpInputs((p, g, m, v), opts, ())


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    return 7 * case.dims["numel"] * itemsize(dtype)  # read p, g, m, v; write p, m, v


SPECS = (
    OpSpec(
        name="adamw_step",
        fn=adamw_step,
        reference=reference.adamw_step,
        eager=reference.adamw_step_eager,
        make_inputs=_inputs,
        cases=(
            Case("small", "fewer elements than one block", {"numel": 1000}),
            Case("blocks", "three blocks with a ragged tail", {"numel": 5000}),
            Case("first_step", "step 1: the largest bias corrections", {"numel": 3000}, {"step": 1}),
            Case("no_decay_maximize", "weight decay 0 and maximize", {"numel": 3000},
                 {"weight_decay": 0.0, "maximize": True}),
            Case("large_lr", "lr 0.1 with beta1 0.3: lerp's other branch", {"numel": 3000},
                 {"lr": 0.1, "beta1": 0.3}),
        ),
        bench_cases=(
            Case("64m", "one 64M-element tensor (a 8192 x 8192 projection)", {"numel": 1 << 26}),
            Case("llama3-8b_mlp", "a Llama 3 8B MLP matrix, 4096 x 14336", {"numel": 4096 * 14336}),
        ),
        flops=lambda c, mode: 15 * c.dims["numel"],
        min_bytes=_bytes,
        has_backward=False,
        description="one AdamW step on a tensor (wavefront::adamw_, the op wavefront.optim.AdamW runs)",
    ),
)
