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

Host cost per step (benchmarks/adamw_host_cost.py; Llama-3-8B's 291 tensors): the first step makes a plan
(one pass over the parameters: state, dtype buckets, the tensors' addresses, and every ``step`` counter
made a view of one tensor per device, so one ``add_`` advances them all); later steps check that plan
against the current objects by identity in C loops (parameter list, gradients' presence, layout and
addresses, the state dicts and their values, the groups' flags) and rebuild it when anything changed. The
per-tensor scalars are computed once per distinct (hyper-parameters, step), and the launch goes to the
kernel directly with one version-counter bump for the mutated tensors (ops/adamw.py), reusing the
kernel's device tables while the addresses stay the same.

``capturable=True`` keeps the step counts on the parameters' device and computes the per-tensor scalars
there, so a step with static gradient buffers makes no host sync and no host-to-device copy (CUDA-graph
capture); without it the scalars are computed on the host and copied.

Where no Triton kernel runs (backend cpu-reference) and for non-contiguous tensors, the update is
torch's own op sequence (wavefront.reference.adamw_update_).
"""

from __future__ import annotations

import operator
from itertools import chain

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
        plan = self.__dict__.get("_plan")
        grads = plan.gradients(self) if plan is not None else None
        if grads is None:
            plan = self._plan = _Plan(self)
            grads = plan.gradients(self)
            assert grads is not None
        for base in plan.step_bases:
            base.add_(1.0)
        rows = _ScalarRows(self.param_groups)
        for gi, tensors, state, maximize, ti in plan.eager:
            grad = grads[ti]
            tensors = [tensors[0], torch.view_as_real(grad) if grad.is_complex() else grad, *tensors[2:]]
            kw = rows.kwargs(gi, float(state["step"]))
            reference.adamw_update_(*tensors, **kw, maximize=maximize)
        for bucket in plan.buckets:
            if bucket.capturable:
                scalars = self._device_scalars(bucket, bucket.device)
            else:
                scalars = rows.table(bucket, bucket.device)
            bucket_grads = [grads[i] for i in bucket.tensor_index]
            if bucket.complex_grads:  # real and complex parameters share a bucket by their real dtype
                bucket_grads = [torch.view_as_real(g) if g.is_complex() else g for g in bucket_grads]
            a = bucket.addresses
            key = ((a[0], tuple(map(torch.Tensor.data_ptr, bucket_grads)), *a[2:]), bucket.numels)
            c = bucket.columns
            ops_adamw.adamw_(c[0], bucket_grads, c[2], c[3], c[4], c[5], scalars, maximize=bucket.maximize,
                             table_key=key)
        return loss

    def _device_scalars(self, bucket: _Bucket, device) -> torch.Tensor:
        """capturable=True: the [n_tensors, 7] scalars computed on the device from the device step counts,
        as torch.optim.AdamW(capturable=True) computes them. The per-tensor hyper-parameters are copied to the
        device only when they change (a scheduler changing a float lr does so every step: a small copy that
        a captured graph would replay with the captured values; give such schedules a fixed lr)."""
        groups = self.param_groups
        hyper = tuple((float(groups[g]["lr"]), *(float(b) for b in groups[g]["betas"]), float(groups[g]["eps"]),
                       float(groups[g]["weight_decay"])) for g in bucket.distinct_groups)
        cache = self.__dict__.setdefault("_hyper_tables", {})
        key = (str(device), tuple(bucket.groups), hyper)
        table = cache.get(key)
        if table is None:
            where = {g: i for i, g in enumerate(bucket.distinct_groups)}
            rows = torch.tensor([hyper[where[g]] for g in bucket.groups], dtype=torch.float64)
            table = cache[key] = rows.to(device)
            if len(cache) > 8:
                cache.pop(next(iter(cache)))
        lr, beta1, beta2, eps, weight_decay = table.unbind(1)
        steps = bucket.device_steps().to(torch.float64)
        bias_correction1 = 1 - beta1.pow(steps)
        bias_correction2 = 1 - beta2.pow(steps)
        return torch.stack([1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, eps, -(lr / bias_correction1),
                            bias_correction2.sqrt()], dim=1)


_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64, torch.complex128)


class _Plan:
    """What a step derives from the parameters, their gradients' presence and layout, the state and the
    param groups' flags: the dtype buckets, the tensors' addresses (the launcher's table key) and the step
    counters gathered into one tensor per device. Built by one pass over the parameters on the first step
    and whenever :meth:`gradients` finds any of that changed; a step that finds it unchanged does no
    per-parameter work beyond gathering the gradients and comparing objects by identity (C loops)."""

    def __init__(self, opt: AdamW):
        groups = opt.param_groups
        self.state_map = opt.state
        self.flat = [p for g in groups for p in g["params"]]
        self.flags = _flags(opt)
        self.with_grad: list[torch.Tensor] = []
        self.states: list[dict] = []
        self.eager: list[tuple] = []
        buckets: dict[tuple, _Bucket] = {}
        triton_on: dict[torch.device, bool] = {}
        grads = []
        for gi, group in enumerate(groups):
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
                state = opt.state[p]
                if not state or (amsgrad and "max_exp_avg_sq" not in state) or (
                        opt.master_weights and "master_param" not in state and p.dtype in _SIXTEEN_BIT):
                    state = opt._state_for(p, amsgrad, capturable)
                ti = len(self.with_grad)
                self.with_grad.append(p)
                self.states.append(state)
                grads.append(grad)
                tensors = [p, grad, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
                           state.get("master_param")]
                if p.is_complex():
                    tensors = [t if t is None else torch.view_as_real(t) for t in tensors]
                fused = triton_on.get(p.device)
                if fused is None:
                    fused = triton_on[p.device] = runtime.uses_triton(p.device)
                if not fused or not all(t is None or t.is_contiguous() for t in tensors):
                    # The gradient slot is filled each step (holding this one would keep it alive).
                    self.eager.append((gi, [tensors[0], None, *tensors[2:]], state, maximize, ti))
                    continue
                if tensors[0].numel() == 0:
                    continue  # nothing to update (its step count still advances)
                key = (p.device, tensors[0].dtype, tensors[1].dtype, tensors[2].dtype, amsgrad, maximize,
                       tensors[5] is not None, capturable)
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = _Bucket(*key)
                bucket.add(tensors, gi, state, ti, p.is_complex())
        self.grad_mask = [p.grad is not None for p in self.flat]
        self.grad_contiguous = [g.is_contiguous() for g in grads]
        self.grad_dtypes = [g.dtype for g in grads]
        self.param_addresses = [p.data_ptr() for p in self.with_grad]
        self.step_bases = _gather_steps(self.states)
        self.state_dicts = list(opt.state.values())
        self.state_values = list(chain.from_iterable(map(dict.values, self.state_dicts)))
        self.buckets = list(buckets.values())
        for bucket in self.buckets:
            bucket.finish()

    def gradients(self, opt: AdamW) -> list[torch.Tensor] | None:
        """The gradients of this step's parameters, in plan order, if the plan still holds; else None."""
        if opt.state is not self.state_map or _flags(opt) != self.flags:
            return None
        flat = [p for g in opt.param_groups for p in g["params"]]
        if len(flat) != len(self.flat) or not all(map(operator.is_, flat, self.flat)):
            return None
        grads = [p.grad for p in flat]
        # Identity, never ==: comparing a tensor with None or a tensor is elementwise.
        if [g is not None for g in grads] != self.grad_mask:
            return None
        grads = [g for g in grads if g is not None]
        if (list(map(torch.Tensor.is_contiguous, grads)) != self.grad_contiguous
                or list(map(_dtype, grads)) != self.grad_dtypes
                or list(map(torch.Tensor.data_ptr, self.with_grad)) != self.param_addresses):
            return None  # a layout or dtype change (a sparse gradient, a grad_dtype) or new parameter storage
        # The state: every per-parameter dict and every value in them, by identity, in C loops (looking each
        # parameter up would call Tensor.__hash__ in Python 291 times). A dict replaced or a value replaced,
        # added or removed shows as a different object or count.
        states = list(self.state_map.values())
        if len(states) != len(self.state_dicts) or not all(map(operator.is_, states, self.state_dicts)):
            return None
        current = list(chain.from_iterable(map(dict.values, states)))
        if len(current) != len(self.state_values) or not all(map(operator.is_, current, self.state_values)):
            return None
        return grads


_dtype = operator.attrgetter("dtype")


def _flags(opt: AdamW) -> tuple:
    """What of the optimizer's settings a plan depends on (hyper-parameters travel per step)."""
    return (opt.master_weights, *((bool(g["amsgrad"]), bool(g["maximize"]), bool(g.get("capturable", False)))
                                  for g in opt.param_groups))


def _gather_steps(states: list[dict]) -> list[torch.Tensor]:
    """Make every ``step`` a view of one tensor per (device, dtype, shape), so one ``add_`` advances them all
    (torch._foreach_add_ over 291 CPU scalars costs ~0.7 ms of host time). Values are kept; the views are
    ordinary 0-d tensors to torch.optim.AdamW and to state dicts."""
    by_kind: dict[tuple, list[dict]] = {}
    for s in states:
        t = s["step"]
        by_kind.setdefault((t.device, t.dtype, tuple(t.shape)), []).append(s)
    bases = []
    for members in by_kind.values():
        base = torch.stack([s["step"] for s in members])
        for s, view in zip(members, base.unbind(0), strict=True):
            s["step"] = view
        bases.append(base)
    return bases


class _Bucket:
    """One dtype group: its tensor columns (gradients come per step), the param group, state and plan index
    of each tensor, and what its launch needs that does not change between steps."""

    def __init__(self, device, p_dtype, g_dtype, s_dtype, amsgrad, maximize, has_master, capturable):
        self.device = device
        self.amsgrad, self.maximize, self.has_master, self.capturable = amsgrad, maximize, has_master, capturable
        self.columns: list[list[torch.Tensor] | None] = [[], [], [], [], [], []]
        self.groups: list[int] = []
        self.states: list[dict] = []
        self.tensor_index: list[int] = []
        self.complex_grads = False

    def add(self, tensors, group_index: int, state: dict, tensor_index: int, is_complex: bool) -> None:
        for col, t in zip(self.columns, tensors, strict=True):
            if t is not None:
                col.append(t)
        self.groups.append(group_index)
        self.states.append(state)
        self.tensor_index.append(tensor_index)
        self.complex_grads |= is_complex

    def finish(self) -> None:
        """After the plan's steps are gathered: the launch's fixed parts."""
        c = self.columns
        c[1] = None  # the gradients are the step's
        c[4] = c[4] if self.amsgrad else None
        c[5] = c[5] if self.has_master else None
        self.addresses = tuple(None if col is None else tuple(t.data_ptr() for t in col) for col in c)
        self.numels = tuple(t.numel() for t in c[0])
        self.distinct_groups = list(dict.fromkeys(self.groups))
        self.index_cache: dict[tuple, torch.Tensor] = {}
        steps = [s["step"] for s in self.states]
        self.step_base = steps[0]._base if all(t._base is steps[0]._base for t in steps) else None
        self.step_positions = None
        if self.step_base is not None:
            stride = self.step_base.stride(0)
            positions = [(t.storage_offset() - self.step_base.storage_offset()) // stride for t in steps]
            if positions == list(range(positions[0], positions[0] + len(positions))):
                self.step_positions = slice(positions[0], positions[0] + len(positions))
            else:
                self.step_positions = torch.tensor(positions, device=self.step_base.device)

    def step_values(self) -> list[float]:
        """This step's counts (host), one per tensor."""
        if self.step_base is None:
            return torch.stack([s["step"] for s in self.states]).tolist()
        if isinstance(self.step_positions, slice):
            return self.step_base[self.step_positions].tolist()
        return self.step_base.index_select(0, self.step_positions).tolist()

    def device_steps(self) -> torch.Tensor:
        """This step's counts as one tensor on the steps' device (no host work when gathered)."""
        if self.step_base is None:
            return torch.stack([s["step"] for s in self.states])
        if isinstance(self.step_positions, slice):
            return self.step_base[self.step_positions]
        return self.step_base.index_select(0, self.step_positions)


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

    def table(self, bucket: _Bucket, device) -> torch.Tensor:
        """[n_tensors, 7] fp64 on `device`: the distinct rows go to the device, an index gathers them (the
        index is kept on the device while the pattern of rows repeats, as it does every step when all
        counts are equal)."""
        keys = list(zip(bucket.groups, bucket.step_values(), strict=True))
        distinct = list(dict.fromkeys(keys))
        host = torch.tensor([self.row(*k) for k in distinct], dtype=torch.float64)
        if len(distinct) == 1:
            return host.to(device, non_blocking=True).expand(len(keys), 7)
        where = {k: i for i, k in enumerate(distinct)}
        pattern = tuple(where[k] for k in keys)
        index = bucket.index_cache.get(pattern)
        if index is None:
            if len(bucket.index_cache) >= 4:
                bucket.index_cache.clear()
            index = bucket.index_cache[pattern] = torch.tensor(pattern).to(device, non_blocking=True)
        return host.to(device, non_blocking=True)[index]
