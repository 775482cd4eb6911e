"""AdamW with one fused launch per dtype group (kernels/adamw.py), a drop-in for torch.optim.AdamW.

Same hyper-parameters, param-group keys and per-parameter state (``step`` as a CPU float32 tensor,
``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq`` with amsgrad) as torch.optim.AdamW, so state dicts load
in either direction and LR schedulers drive it unchanged. Each ``step()`` groups the parameters that
have gradients by (device, dtypes, amsgrad, maximize) and launches the kernel once per group, whatever
the number of tensors or param groups (their lr, betas, eps and weight decay travel per tensor).

``master_weights=True`` keeps an fp32 copy of every 16-bit parameter (state key ``master_param``) with
fp32 moments; the update runs on the copy and the parameter receives its rounding, so small updates are
not lost to bf16 spacing. torch.optim.AdamW ignores the extra key when loading such a state dict (and
casts the moments to the parameter dtype); loading a torch state dict here seeds the copy from the
parameter.

Where no Triton kernel runs (backend cpu-reference) and for non-contiguous tensors, the update is
torch's own op sequence (wavefront.reference.adamw_update_).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from wavefront import reference, runtime

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's algorithm (decoupled weight decay, bias correction, optional amsgrad and
    maximize) with a fused multi-tensor update; see the module docstring."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 master_weights: bool = False):
        if not float(lr) >= 0.0:
            raise ValueError(f"AdamW: argument 'lr' must be >= 0, got {lr}")
        if not eps >= 0.0:
            raise ValueError(f"AdamW: argument 'eps' must be >= 0, got {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"AdamW: argument 'betas[{i}]' must be in [0, 1), got {beta}")
        if not weight_decay >= 0.0:
            raise ValueError(f"AdamW: argument 'weight_decay' must be >= 0, got {weight_decay}")
        # The same keys as torch.optim.AdamW's param groups, so state dicts are interchangeable.
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                    "maximize": maximize, "foreach": None, "capturable": False, "differentiable": False,
                    "fused": None, "decoupled_weight_decay": True}
        super().__init__(params, defaults)
        self.master_weights = bool(master_weights)

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("master_weights", False)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group["decoupled_weight_decay"] = True

    def _state_for(self, p: torch.Tensor, amsgrad: bool) -> dict:
        state = self.state[p]
        master = self.master_weights and p.dtype in _SIXTEEN_BIT
        moment_dtype = torch.float32 if master else p.dtype
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, dtype=moment_dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=moment_dtype, memory_format=torch.preserve_format)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(state["exp_avg_sq"])
        if master:
            if "master_param" not in state:
                state["master_param"] = p.detach().to(torch.float32, copy=True)
            for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                if key in state and state[key].dtype != torch.float32:  # loaded from a 16-bit state dict
                    state[key] = state[key].to(torch.float32)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for group in self.param_groups:
            lr = float(group["lr"])  # a tensor lr is read once per step (torch's capturable mode is not offered)
            beta1, beta2 = (float(b) for b in group["betas"])
            amsgrad, maximize = bool(group["amsgrad"]), bool(group["maximize"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self._state_for(p, amsgrad)
                state["step"] += 1
                kw = dict(lr=lr, beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                          weight_decay=float(group["weight_decay"]), step=float(state["step"]), maximize=maximize)
                tensors = (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
                           state.get("master_param"))
                fused = runtime.uses_triton(p.device) and all(t is None or t.is_contiguous() for t in tensors)
                if not fused:
                    reference.adamw_update_(*tensors, **kw)
                    continue
                key = (p.device, p.dtype, p.grad.dtype, state["exp_avg"].dtype, amsgrad, maximize,
                       "master_param" in state)
                bucket = buckets[key]
                for name, t in zip(("params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "masters"),
                                   tensors, strict=True):
                    bucket[name].append(t)
                bucket["kw"].append(kw)
        if buckets:
            self._launch(buckets)
        return loss

    @staticmethod
    def _launch(buckets) -> None:
        from wavefront.kernels import adamw as kernels
        from wavefront.kernels._launch import op_scope

        for (_, _, _, _, amsgrad, maximize, has_master), b in buckets.items():
            scalars = [kernels.step_scalars(kw["lr"], kw["beta1"], kw["beta2"], kw["eps"], kw["weight_decay"],
                                            kw["step"]) for kw in b["kw"]]
            with op_scope("adamw"):
                kernels.adamw_multi_tensor(b["params"], b["grads"], b["exp_avgs"], b["exp_avg_sqs"],
                                           b["max_exp_avg_sqs"] if amsgrad else None,
                                           b["masters"] if has_master else None, scalars, maximize=maximize)
