"""A functional AdamW step on one tensor: the fused multi-tensor kernel behind a registry entry.

``wavefront.optim.AdamW`` launches the kernel over all of a dtype group's parameters in place; this op
runs the same kernel on copies of one tensor and returns them, which is what the registry needs for its
accuracy sweep, torch.compile test, inspect and traffic (the launch is recorded like any other).
"""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import check_same_device, check_shape, check_tensor


@torch.library.custom_op("wavefront::adamw_step", mutates_args=())
def _adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, lr: float, beta1: float,
                beta2: float, eps: float, weight_decay: float, step: float, maximize: bool
                ) -> tuple[Tensor, Tensor, Tensor]:
    from wavefront.kernels import adamw as kernels
    from wavefront.kernels._launch import op_scope

    p, m, v = (t.contiguous().clone() for t in (param, exp_avg, exp_avg_sq))
    with op_scope("adamw_step"):
        kernels.adamw_multi_tensor([p], [grad.contiguous()], [m], [v], None, None,
                                   [kernels.step_scalars(lr, beta1, beta2, eps, weight_decay, step)], maximize=maximize)
    return p, m, v


@_adamw_step.register_fake
def _(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step, maximize):
    return torch.empty_like(param), torch.empty_like(exp_avg), torch.empty_like(exp_avg_sq)


def adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, lr: float, beta1: float = 0.9,
               beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2, step: int = 1,
               maximize: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """One AdamW step (torch.optim.AdamW's arithmetic, fp32 inside) returning new (param, exp_avg,
    exp_avg_sq). ``step`` is the step number after incrementing (1 on the first step)."""
    op = "adamw_step"
    for name, t in (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        check_tensor(op, name, t, min_dim=0)
        check_shape(op, name, t, tuple(param.shape), "the shape of 'param'")
    check_same_device(op, param=param, grad=grad, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    if step < 1:
        raise ValueError(f"{op}: argument 'step' must be >= 1 (the count after this step), got {step}")
    kw = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, step=step, maximize=maximize)
    if param.numel() == 0 or not runtime.uses_triton(param.device):
        return reference.adamw_step_eager(param, grad, exp_avg, exp_avg_sq, **kw)
    return torch.ops.wavefront.adamw_step(param, grad, exp_avg, exp_avg_sq, float(lr), float(beta1), float(beta2),
                                          float(eps), float(weight_decay), float(step), bool(maximize))


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
        description="one AdamW step on a tensor (the multi-tensor kernel of wavefront.optim.AdamW)",
    ),
)
