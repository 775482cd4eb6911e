"""The timed region of one (op, case, mode) for any provider's function, with everything else done before.

Inputs come from the op's ``make_inputs`` (random, never zeros). For ``bwd`` the forward runs once
outside the timed region and the upstream gradients are allocated up front; the timed call is
``torch.autograd.grad(..., retain_graph=True)``, which returns fresh gradients rather than accumulating
into ``.grad`` (no zeroing inside the loop). ``fwd`` runs with the gradient inputs requiring grad, as in
training (the op saves what its backward needs); ``fwd_bwd`` is one training step of the op.

Like timer.py this module depends on torch and duck-typed registry objects only, so the bisect and
compare probes can carry it to other revisions of the code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MODES: tuple[str, ...] = ("fwd", "bwd", "fwd_bwd")


def modes_for(spec) -> tuple[str, ...]:
    """The modes an op supports: forward only when it declares no backward."""
    return MODES if spec.has_backward else ("fwd",)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def formula(spec, case, dtype, mode: str) -> tuple[float, int]:
    """(FLOPs, minimal bytes) of one call in `mode`, from the registry's formulas."""
    check_mode(mode)
    parts = ("fwd", "bwd") if mode == "fwd_bwd" else (mode,)
    return (float(sum(spec.flops(case, m) for m in parts)), int(sum(spec.min_bytes(case, dtype, m) for m in parts)))


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def tensor_bytes(args) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


@dataclass
class Runnable:
    """call(): the timed region. first_output: the forward's first output, to cross-check providers."""

    call: Callable[[], Any]
    first_output: torch.Tensor | None
    input_bytes: int


def prepare(fn: Callable[..., Any], inputs, mode: str, gen: torch.Generator) -> Runnable:
    """Build the timed call of `fn` on `inputs` (an OpInputs) in `mode`; see the module docstring."""
    check_mode(mode)
    grad_argnums = tuple(inputs.grad_argnums)
    if mode != "fwd" and not grad_argnums:
        raise ValueError(f"mode {mode!r} needs inputs that receive gradients; this op declares none")
    args = tuple(a.detach().requires_grad_(True) if i in grad_argnums and isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(inputs.args))
    kwargs = dict(inputs.kwargs)
    targets = [args[i] for i in grad_argnums]
    n_bytes = tensor_bytes(args) + tensor_bytes(kwargs.values())

    if mode == "fwd":
        with torch.no_grad():
            first = _as_tuple(fn(*args, **kwargs))[0]
        return Runnable(lambda: fn(*args, **kwargs), first if isinstance(first, torch.Tensor) else None, n_bytes)

    outs = _as_tuple(fn(*args, **kwargs))
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    if not diff:
        raise ValueError("no output of the function requires grad; cannot time its backward")
    dys = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(dtype=o.dtype, device=o.device)
           for o in diff]
    first = outs[0].detach() if isinstance(outs[0], torch.Tensor) else None

    if mode == "bwd":
        def call():
            return torch.autograd.grad(diff, targets, dys, retain_graph=True, allow_unused=True)
    else:
        def call():
            step_outs = [o for o in _as_tuple(fn(*args, **kwargs)) if isinstance(o, torch.Tensor) and o.requires_grad]
            return torch.autograd.grad(step_outs, targets, dys, allow_unused=True)

    return Runnable(call, first, n_bytes + tensor_bytes(dys))
