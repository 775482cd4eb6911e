"""FSDP2 all-gather of FP8 weights: each rank quantizes its own shard of a Float8Linear weight and the
all-gather moves FP8 bytes (plus the scales) instead of bf16, half the bytes.

    enable_fp8_all_gather(model, shard_degree)   # before fully_shard: wraps the Float8Linear weights
    fully_shard(layer, ...); fully_shard(model, ...)

How (FSDP2's all-gather extension points, ``fsdp_pre_all_gather`` / ``fsdp_post_all_gather`` on the sharded
local tensor): the weight Parameter holds a :class:`Fp8ShardedWeight`, a tensor subclass around the
high-precision weight that survives FSDP2's sharding (its ops run on the inner tensor; the optimizer
updates the fp32 master shard as usual). Before each all-gather it casts its shard to the mixed-precision
``param_dtype`` (the value FSDP2 would have gathered) and quantizes it; after it, the module sees a
:class:`Fp8GatheredWeight` [N, K] (outer dtype ``param_dtype``, FP8 data and scales inside) that
``Float8Linear`` multiplies without quantizing the weight again. Its gradient is a plain tensor, which
FSDP2 reduce-scatters as always.

Which FP8 copy moves, per recipe (scales as ``ops.quantize`` returns them for the recipe's weight):

    recipe      forward all-gather                        backward re-gather (dx = dY W)
    rowwise     W per row: shard-local scales, gathered    W per column (the layout of W^T's rows): one
                with the data (c x 4 B per rank)           all-reduce (max) of K column amaxes first
    tensorwise  one scale: one all-reduce (max) of amax    the forward's copy serves (one scale)
    blockwise   128x128 blocks: shard-local when a shard   the forward's copy serves (a 128x128 block of
                is whole 128-row blocks                    W^T is a block of W transposed)

The amaxes are exact and every rank derives the same scales, so the quantized values are bit-identical to
the op quantizing the gathered bf16 weight: forward output and both gradients equal FSDP2 without FP8
all-gather bit for bit (tests/parallel/test_fp8_fsdp.py). The rowwise backward copy is chosen when the
all-gather runs inside the backward pass (FSDP2's re-gather after ``reshard_after_forward``). Where the
copy a product needs is not the one held (no re-gather: ``reshard_after_forward=False`` or the root
module; or activation checkpointing recomputing the forward inside the backward), the product gathers its
copy itself from the local shard (one extra FP8 all-gather, same values). MXFP8 (1x32 blocks along K) is
not gathered in FP8; weights whose shards are not whole 128-row blocks under blockwise neither: both stay
plain Parameters gathered in high precision (listed in the report).

The FSDP2 all-gather input is the FP8 shard viewed as uint8 (one dtype for every backend; gloo has no fp8)
of FSDP2's padded shard size; the scales move in one small collective of their own (an all-gather of the
shard's scales or an all-reduce of amaxes), which FSDP2's extension contract would only let us fold into
its all-gather for evenly sharded weights. FSDP2's ``reshard_after_forward`` as an int (a smaller re-gather
mesh) has no extension support in torch; ``enable_fp8_all_gather`` does not check it, FSDP2 raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._pytree import tree_map

from wavefront import ops, reference
from wavefront.nn.fp8 import Float8Linear, PrequantizedWeight
from wavefront.ops.linear_fp8 import Quantized, backward_prequantized, default_fnuz, forward_prequantized

RECIPES = ("rowwise", "tensorwise", "blockwise")  # MXFP8 is refused (module docstring)
_BLOCK_ROWS = 128

aten = torch.ops.aten
# Ops FSDP2 applies to a parameter while sharding it (chunk, pad, copy, view, detach, DTensor wrapping): their
# results stay wrapped so the sharded local tensor keeps the extension points. Every other op runs on the
# inner tensor and returns plain tensors (the optimizer's updates, the state's zeros_like).
_PRESERVE = {aten.detach.default, aten.view.default, aten._unsafe_view.default, aten.slice.Tensor, aten.split.Tensor,
             aten.split_with_sizes.default, aten.new_zeros.default, aten.empty_like.default, aten.clone.default,
             aten.as_strided.default, aten.alias.default, aten._to_copy.default, aten.narrow.default}


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _weight_operand(recipe: str, fnuz: bool) -> tuple[torch.dtype, str, bool]:
    fmt, scaling, pow2 = reference.fp8_recipe_operand(recipe, "weight", fnuz)
    return reference.FP8_FORMATS[fmt], scaling, pow2


def _quantize_with_amax(w: Tensor, amax: Tensor, fmt: torch.dtype, pow2: bool) -> tuple[Tensor, Tensor]:
    """(q, scale) of w with scales from a given amax (broadcast over w): the formula of reference.fp8_quantize
    (scale = FP8_MAX / max(amax, EPS) in fp32, optional power-of-two rounding, one fp32 product, clamp, RNE),
    so the values equal ops.quantize's where the amax is the same."""
    fp8_max = torch.finfo(fmt).max
    scale = torch.full_like(amax, fp8_max) / amax.float().clamp_min(reference.FP8_EPS)
    if pow2:
        scale = (scale.view(torch.int32) & -8388608).view(torch.float32)
    return (w.float() * scale).clamp(-fp8_max, fp8_max).to(fmt), scale


def _all_reduce_max(t: Tensor, group) -> Tensor:
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t


def _all_gather_rows(t: Tensor, group) -> Tensor:
    """Concatenate every rank's `t` (same shape) along dim 0; fp8 moves as uint8 (gloo has no fp8)."""
    world = dist.get_world_size(group)
    raw = t.view(torch.uint8) if t.dtype.itemsize == 1 and t.dtype != torch.uint8 else t
    out = raw.new_empty((world * raw.shape[0], *raw.shape[1:]))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the name before torch 2.10
    gather(out, raw.contiguous(), group=group)
    return out.view(t.dtype) if raw is not t else out


@dataclass
class _Copy:
    """One FP8 copy of a shard: q [c, K] (the all-gather input) and the whole weight's scales after their
    collective; `axis` "row" (forward layout) or "col" (W quantized per column: the dx product's W^T)."""

    q: Tensor
    scale: Tensor
    axis: str


def _quantize_shard(w: Tensor, recipe: str, fnuz: bool, axis: str, group) -> _Copy:
    """Quantize the padded shard w [c, K] (already in param_dtype) for `axis`; the scale collectives run here."""
    fmt, scaling, pow2 = _weight_operand(recipe, fnuz)
    fmt_name = next(k for k, v in reference.FP8_FORMATS.items() if v == fmt)
    if scaling == "tensorwise" or axis == "col":
        mag = w.abs()
        mag = torch.where(mag.isnan(), 0.0, mag)  # NaN-ignoring, like ops.quantize's amax
    if scaling == "tensorwise":
        amax = _all_reduce_max(mag.amax().float(), group)
        q, s = _quantize_with_amax(w, amax, fmt, pow2)
        return _Copy(q, s, "row")
    if axis == "col":  # rowwise backward: per-column scales over the whole N
        amax = _all_reduce_max(mag.amax(0).float(), group)
        q, s = _quantize_with_amax(w, amax[None, :], fmt, pow2)
        return _Copy(q, s.view(-1, 1), "col")
    q, s = ops.quantize(w, dtype=fmt_name, scaling=scaling, pow2_scale=pow2)  # shard-local scale groups
    return _Copy(q, _all_gather_rows(s, group), "row")


def _shard_copy(hp: Tensor, dtype: torch.dtype, n_rows: int, recipe: str, fnuz: bool, axis: str, group) -> _Copy:
    """The FP8 copy of a local shard `hp` of an [n_rows, K] weight: cast to `dtype` (the value FSDP2 would gather),
    zero-padded to FSDP2's padded shard size (the all-gather input), quantized for `axis`."""
    world = dist.get_world_size(group)
    padded = -(-n_rows // world)
    w = hp.to(dtype)
    if w.shape[0] < padded:  # FSDP2 pads the last shards
        w = torch.cat([w, w.new_zeros((padded - w.shape[0], *w.shape[1:]))])
    return _quantize_shard(w, recipe, fnuz, axis, group)


def _unpadded_scales(scale: Tensor, scaling: str, axis: str, n_rows: int) -> Tensor:
    """The whole weight's scales from a gathered copy's: per-row groups of the padded rows cut to the weight's
    n_rows (128-row blocks: to its blocks); per-column and tensorwise scales are whole already."""
    if scaling == "block128x128" and axis == "row":
        return scale[: -(-n_rows // _BLOCK_ROWS)]
    if scaling == "rowwise" and axis == "row":
        return scale[:n_rows]
    return scale


class Fp8ShardedWeight(torch.Tensor, PrequantizedWeight):
    """A Float8Linear's high-precision weight (whole, or its FSDP2 shard) whose FSDP2 all-gather moves FP8."""

    _hp: Tensor
    recipe: str
    fnuz: bool

    @staticmethod
    def __new__(cls, hp: Tensor, recipe: str, fnuz: bool):
        t = torch.Tensor._make_wrapper_subclass(cls, hp.shape, strides=hp.stride(), storage_offset=hp.storage_offset(),
                                                dtype=hp.dtype, device=hp.device, requires_grad=hp.requires_grad)
        t._hp, t.recipe, t.fnuz = hp, recipe, fnuz
        return t

    def __init__(self, hp: Tensor, recipe: str, fnuz: bool):
        super().__init__()

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        return f"Fp8ShardedWeight({self._hp!r}, recipe={self.recipe!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        meta: list = []

        def unwrap(t):
            if isinstance(t, Fp8ShardedWeight):
                meta.append((t.recipe, t.fnuz))
                return t._hp
            return t

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        if func is aten.copy_.default:
            return args[0]
        if func not in _PRESERVE:
            return out
        return tree_map(lambda t: cls(t, *meta[0]) if isinstance(t, Tensor) else t, out)

    def fp8_linear(self, x: Tensor, bias: Tensor | None, residual: Tensor | None, provider: str) -> Tensor:
        """Outside FSDP2 (or before fully_shard): the plain FP8 linear on the inner weight."""
        return ops.linear_fp8(x, _Unwrap.apply(self), bias, residual=residual, recipe=self.recipe, fnuz=self.fnuz,
                              provider=provider)

    # FSDP2 extension points -------------------------------------------------------------------------------

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        group = mesh.get_group()
        world = mesh.size()
        n_rows = outer_size[0]
        padded = -(-n_rows // world)
        dtype = mp_policy.param_dtype or self._hp.dtype
        _, scaling, _ = _weight_operand(self.recipe, self.fnuz)
        if scaling == "block128x128" and padded % _BLOCK_ROWS and world > 1:
            raise ValueError(f"FP8 all-gather (blockwise): weight {tuple(outer_size)} over {world} ranks gives shards "
                             f"of {padded} rows, not whole 128-row blocks; enable_fp8_all_gather(shard_degree={world})"
                             f" leaves such weights in high precision")
        axis = "col" if scaling == "rowwise" and _in_backward() else "row"
        copy = _shard_copy(self._hp, dtype, n_rows, self.recipe, self.fnuz, axis, group)
        return (copy.q.view(torch.uint8),), (copy.scale, copy.axis, n_rows, group, dtype)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        (raw,) = all_gather_outputs
        scale, axis, n_rows, group, dtype = metadata
        fmt, scaling, _ = _weight_operand(self.recipe, self.fnuz)
        q = raw.view(fmt)[:n_rows]
        scale = _unpadded_scales(scale, scaling, axis, n_rows)
        if out is not None:
            out._set_copy(scale, axis, self, group)
            return None
        gathered = Fp8GatheredWeight(q, dtype, self.recipe, self.fnuz)
        gathered._set_copy(scale, axis, self, group)
        return gathered, (raw,)


class _Unwrap(torch.autograd.Function):
    """The inner high-precision weight of an Fp8ShardedWeight; its gradient goes to the wrapper."""

    @staticmethod
    def forward(ctx, w):
        return w._hp

    @staticmethod
    def backward(ctx, grad):
        return grad


@dataclass
class _GatherState:
    """What the last all-gather left: the scales of the FP8 copy held, its axis, the local shard, the group."""

    scale: Tensor | None = None
    axis: str = "row"
    shard: Fp8ShardedWeight | None = None
    group: object = None


class Fp8GatheredWeight(torch.Tensor, PrequantizedWeight):
    """The unsharded weight FSDP2 hands the module: [N, K] of dtype param_dtype outside, the FP8 data and its
    scales inside. Only Float8Linear reads it (through :meth:`fp8_linear`); other ops raise."""

    _q: Tensor
    _state: _GatherState

    @staticmethod
    def __new__(cls, q: Tensor, dtype: torch.dtype, recipe: str, fnuz: bool, state: _GatherState | None = None):
        t = torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=dtype, device=q.device, requires_grad=False)
        t._q, t.recipe, t.fnuz, t._state = q, recipe, fnuz, state or _GatherState()
        return t

    def __init__(self, *args, **kwargs):
        super().__init__()

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        return f"Fp8GatheredWeight(shape={tuple(self.shape)}, {self._q.dtype}, recipe={self.recipe!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        w = args[0]
        if func in (aten.detach.default, aten.alias.default, aten.as_strided.default, aten.view.default):
            # FSDP2 views the gathered tensor at its own size and wraps it in a Parameter: same data, same state
            return cls(w._q, w.dtype, w.recipe, w.fnuz, w._state)
        raise NotImplementedError(f"an FP8-gathered weight (FSDP2 FP8 all-gather) is read by wavefront.nn.Float8Linear "
                                  f"only; {func} is not supported on it")

    def _set_copy(self, scale: Tensor, axis: str, shard: Fp8ShardedWeight, group) -> None:
        self._state.scale, self._state.axis, self._state.shard, self._state.group = scale, axis, shard, group

    def _operand(self, axis: str) -> Quantized:
        """The weight quantized for the forward ("row": W [N, K] along K) or for dx ("col": W^T [K, N] along N)."""
        _, scaling, _ = _weight_operand(self.recipe, self.fnuz)
        st = self._state
        q, scale, held = self._q, st.scale, st.axis
        if scaling == "rowwise" and held != axis:
            # The copy gathered is the other one (no re-gather before backward, or a recomputed forward):
            # gather this one from the local shard, the same values FSDP2's re-gather would give.
            n_rows = self.shape[0]
            copy = _shard_copy(st.shard._hp, self.dtype, n_rows, self.recipe, self.fnuz, axis, st.group)
            q = _all_gather_rows(copy.q, st.group)[:n_rows]
            scale = _unpadded_scales(copy.scale, scaling, axis, n_rows)
        if axis == "row":
            return Quantized(q, scale, scaling)
        if scaling == "rowwise":
            return Quantized(q.t().contiguous(), scale, scaling)
        return Quantized(q.t().contiguous(), scale if scale.dim() == 0 else scale.t().contiguous(), scaling)

    def fp8_linear(self, x: Tensor, bias: Tensor | None, residual: Tensor | None, provider: str) -> Tensor:
        N, K = self.shape
        if x.shape[-1] != K:
            raise ValueError(f"Float8Linear: the last dim of 'x' ({x.shape[-1]}) must equal in_features ({K})")
        x2 = x.reshape(-1, K)
        res = None if residual is None else residual.reshape(-1, N)
        y = _GatheredLinear.apply(x2, self, bias, res, provider)
        return y.view(*x.shape[:-1], N)


class _GatheredLinear(torch.autograd.Function):
    """y = Qa(x) W^T + b + r with W given as its FP8-gathered copies; dW is a plain tensor for FSDP2."""

    @staticmethod
    def forward(ctx, x2, w, bias, residual, provider):
        y = forward_prequantized(x2, w._operand("row"), bias, residual, w.recipe, w.fnuz, provider)
        ctx.save_for_backward(x2)
        ctx.w, ctx.provider, ctx.has_bias, ctx.has_res = w, provider, bias is not None, residual is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        w = ctx.w
        needs_x, needs_w, needs_b, needs_r = ctx.needs_input_grad[:4]
        wt = w._operand("col") if needs_x else None
        dx, dw, db = backward_prequantized(dy.contiguous(), x2, wt, tuple(w.shape), w.dtype, w.recipe, w.fnuz,
                                           ctx.provider, (needs_x, needs_w, needs_b and ctx.has_bias))
        return dx, dw, db, dy if needs_r and ctx.has_res else None, None


@dataclass(frozen=True)
class Fp8AllGatherReport:
    """Which Float8Linear weights gather in FP8, and why the others do not."""

    wrapped: tuple[str, ...]
    skipped: dict[str, str]


def fp8_all_gather_reason(linear: Float8Linear, shard_degree: int) -> str | None:
    """Why this layer's weight cannot gather in FP8 over `shard_degree` ranks, or None."""
    if linear.recipe not in RECIPES:
        return f"recipe {linear.recipe!r} has no FP8 all-gather (supported: {', '.join(RECIPES)})"
    n_rows = linear.weight.shape[0]
    if linear.recipe == "blockwise" and shard_degree > 1 and (-(-n_rows // shard_degree)) % _BLOCK_ROWS:
        return (f"blockwise: {n_rows} rows over {shard_degree} ranks are shards of {-(-n_rows // shard_degree)} rows, "
                f"not whole 128-row blocks")
    return None


def enable_fp8_all_gather(model: nn.Module, shard_degree: int, *, marked_only: bool = True) -> Fp8AllGatherReport:
    """Wrap the weight of every Float8Linear of `model` marked ``fp8_all_gather`` (every one with
    ``marked_only=False``) that can gather in FP8 over `shard_degree` FSDP2 ranks. Call before fully_shard; the
    Parameters are new objects (same values), so build the optimizer after. Idempotent."""
    if shard_degree < 1:
        raise ValueError(f"enable_fp8_all_gather: 'shard_degree' must be >= 1, got {shard_degree}")
    wrapped, skipped = [], {}
    for name, mod in model.named_modules():
        if (not isinstance(mod, Float8Linear) or isinstance(mod.weight, Fp8ShardedWeight)
                or (marked_only and not mod.fp8_all_gather)):
            continue
        why = fp8_all_gather_reason(mod, shard_degree)
        if why:
            skipped[name] = why
            continue
        w = mod.weight
        fnuz = default_fnuz(w.device) if mod.fnuz is None else mod.fnuz
        mod.weight = nn.Parameter(Fp8ShardedWeight(w.detach(), mod.recipe, fnuz), requires_grad=w.requires_grad)
        wrapped.append(name)
    return Fp8AllGatherReport(tuple(wrapped), skipped)


def disable_fp8_all_gather(model: nn.Module) -> int:
    """Undo :func:`enable_fp8_all_gather` on an unsharded model: plain Parameters again; how many."""
    n = 0
    for mod in model.modules():
        if isinstance(mod, Float8Linear) and isinstance(mod.weight, Fp8ShardedWeight):
            mod.weight = nn.Parameter(mod.weight._hp.detach(), requires_grad=mod.weight.requires_grad)
            n += 1
    return n
