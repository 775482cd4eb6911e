"""AdamW with one fused launch per dtype group (the op ``wavefront::adamw_``), a drop-in for torch.optim.AdamW.

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

fp64 parameters update in fp64; complex parameters update as their real views (torch.optim.AdamW's rule),
with complex state like torch's. Other dtypes are refused with a ValueError naming the parameter.

Host cost per step: one pass over the parameters in Python (state lookup, the 291 step counters of a
Llama-3-8B incremented by one ``torch._foreach_add_``), the per-tensor scalars computed once per distinct
(hyper-parameters, step) and gathered on the device, and the kernel's device tables reused while the
tensors' addresses stay the same (kernels/adamw.py); benchmarks/adamw_host_cost.py measures it.

``capturable=True`` keeps the step counts on the parameters' device and computes the per-tensor scalars
there, so a step with static gradient buffers makes no host sync and no host-to-device copy (CUDA-graph
capture); without it the scalars are computed on the host and copied.

Where no Triton kernel runs (backend cpu-reference) and for non-contiguous tensors, the update is
torch's own op sequence (wavefront.reference.adamw_update_).
"""

from __future__ import annotations

import torch

from wavefront import reference, runtime
from wavefront.ops import adamw as ops_adamw

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's algorithm (decoupled weight decay, bias correction, optional amsgrad and
    maximize) with a fused multi-tensor update; see the module docstring."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 master_weights: bool = False, capturable: bool = False):
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
                    "maximize": maximize, "foreach": None, "capturable": bool(capturable), "differentiable": False,
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

    def _state_for(self, p: torch.Tensor, amsgrad: bool, capturable: bool = False) -> dict:
        state = self.state[p]
        master = self.master_weights and p.dtype in _SIXTEEN_BIT
        moment_dtype = torch.float32 if master else p.dtype
        if not state:
            # torch.optim.AdamW's convention: the step count on the CPU, on the parameter's device if capturable.
            state["step"] = torch.tensor(0.0, dtype=torch.float32, device=p.device if capturable else "cpu")
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
        buckets: dict[tuple, _Bucket] = {}
        eager = []
        steps = []
        triton_on: dict[torch.device, bool] = {}
        for gi, group in enumerate(self.param_groups):
            amsgrad, maximize = bool(group["amsgrad"]), bool(group["maximize"])
            capturable = bool(group.get("capturable", False))
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                if p.dtype not in _SUPPORTED:
                    raise ValueError(f"AdamW: parameter of dtype {p.dtype} (shape {tuple(p.shape)}) is not supported: "
                                     f"floating point (fp32, bf16, fp16, fp64) or complex parameters only")
                state = self.state[p]
                if not state or (amsgrad and "max_exp_avg_sq" not in state) or (
                        self.master_weights and "master_param" not in state and p.dtype in _SIXTEEN_BIT):
                    state = self._state_for(p, amsgrad, capturable)
                steps.append(state["step"])
                tensors = [p, grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
                           state.get("master_param")]
                if p.is_complex():
                    tensors = [t if t is None else torch.view_as_real(t) for t in tensors]
                fused = triton_on.get(p.device)
                if fused is None:
                    fused = triton_on[p.device] = runtime.uses_triton(p.device)
                if not fused or not all(t is None or t.is_contiguous() for t in tensors):
                    eager.append((gi, tensors, state, maximize))
                    continue
                key = (p.device, tensors[0].dtype, tensors[1].dtype, tensors[2].dtype, amsgrad, maximize,
                       tensors[5] is not None, capturable)
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = _Bucket()
                bucket.add(tensors, gi, state)
        if steps:
            torch._foreach_add_(steps, 1.0)
        rows = _ScalarRows(self.param_groups)
        for gi, tensors, state, maximize in eager:
            kw = rows.kwargs(gi, float(state["step"]))
            reference.adamw_update_(*tensors, **kw, maximize=maximize)
        for key, bucket in buckets.items():
            device, _, _, _, amsgrad, maximize, has_master, capturable = key
            if capturable:
                scalars = self._device_scalars(bucket, device)
            else:
                scalars = rows.table(bucket.groups, bucket.states, device)
            c = bucket.columns
            ops_adamw.adamw_(c[0], c[1], c[2], c[3], c[4] if amsgrad else None, c[5] if has_master else None,
                             scalars, maximize=maximize)
        return loss


    def _device_scalars(self, bucket: _Bucket, device) -> torch.Tensor:
        """capturable=True: the [n_tensors, 7] scalars computed on the device from the device step counts,
        as torch.optim.AdamW(capturable=True) computes them. The per-tensor hyper-parameters are copied to the
        device only when they change (a scheduler changing a float lr does so every step: a small copy that
        a captured graph would replay with the captured values; give such schedules a fixed lr)."""
        groups = self.param_groups
        hyper = tuple((float(groups[g]["lr"]), *(float(b) for b in groups[g]["betas"]), float(groups[g]["eps"]),
                       float(groups[g]["weight_decay"])) for g in dict.fromkeys(bucket.groups))
        cache = self.__dict__.setdefault("_hyper_tables", {})
        key = (str(device), tuple(bucket.groups), hyper)
        table = cache.get(key)
        if table is None:
            where = {g: i for i, g in enumerate(dict.fromkeys(bucket.groups))}
            rows = torch.tensor([hyper[where[g]] for g in bucket.groups], dtype=torch.float64)
            table = cache[key] = rows.to(device)
            if len(cache) > 8:
                cache.pop(next(iter(cache)))
        lr, beta1, beta2, eps, weight_decay = table.unbind(1)
        steps = torch.stack([s["step"] for s in bucket.states]).to(torch.float64)
        bias_correction1 = 1 - beta1.pow(steps)
        bias_correction2 = 1 - beta2.pow(steps)
        return torch.stack([1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, eps, -(lr / bias_correction1),
                            bias_correction2.sqrt()], dim=1)


_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64, torch.complex128)


class _Bucket:
    """One dtype group's tensor columns, the param group of each tensor and its state."""

    __slots__ = ("columns", "groups", "states")

    def __init__(self):
        self.columns: list[list[torch.Tensor]] = [[], [], [], [], [], []]
        self.groups: list[int] = []
        self.states: list[dict] = []

    def add(self, tensors, group_index: int, state: dict) -> None:
        for col, t in zip(self.columns, tensors, strict=True):
            if t is not None:
                col.append(t)
        self.groups.append(group_index)
        self.states.append(state)


class _ScalarRows:
    """The kernel's per-tensor scalars, computed once per distinct (param group, step) of this step."""

    def __init__(self, param_groups):
        self.param_groups = param_groups
        self._cache: dict[tuple[int, float], tuple] = {}

    def kwargs(self, gi: int, step: float) -> dict:
        group = self.param_groups[gi]
        beta1, beta2 = (float(b) for b in group["betas"])
        # A tensor lr is read once per step (torch's capturable mode is not offered).
        return dict(lr=float(group["lr"]), beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]), step=step)

    def row(self, gi: int, step: float) -> tuple:
        row = self._cache.get((gi, step))
        if row is None:
            row = self._cache[(gi, step)] = ops_adamw.step_scalars(**self.kwargs(gi, step))
        return row

    def table(self, groups: list[int], states: list[dict], device) -> torch.Tensor:
        """[n_tensors, 7] fp64 on `device`: the distinct rows go to the device, an index gathers them."""
        step_values = torch.stack([s["step"] for s in states]).tolist()
        keys = list(zip(groups, step_values, strict=True))
        distinct = list(dict.fromkeys(keys))
        host = torch.tensor([self.row(*k) for k in distinct], dtype=torch.float64)
        if len(distinct) == 1:
            return host.to(device, non_blocking=True).expand(len(keys), 7)
        where = {k: i for i, k in enumerate(distinct)}
        index = torch.tensor([where[k] for k in keys])
        return host.to(device, non_blocking=True)[index.to(device, non_blocking=True)]
