"""Expert parallelism: dropless, capacity-free MoE experts spread over a process group.

Rank r of an expert-parallel group of size P holds experts [r E_r, (r + 1) E_r) of E = P E_r (contiguous, equal
slices of ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I)). Every rank routes its own tokens (the router
and everything outside the experts is replicated or data-parallel), then per layer:

    moe_permute          this rank's T k (token, slot) rows into global expert order, so the rows bound for
                         rank d are one contiguous run (experts of d are contiguous)
    all_to_all (counts)  the (E,) per-expert counts: rank d learns how many rows each source sends to each of
                         its experts; both split vectors then cross to the host ONCE per layer
    all_to_all (rows)    the token rows, uneven splits (``all_to_all_single`` with split sizes)
    regroup              received rows are ordered (source, local expert): a stable sort by local expert
                         gives one group per local expert for the grouped GEMM
    grouped_linear x 2   SwiGLU gate/up, then down, over this rank's experts only
    reverse all_to_all   the expert outputs go back to the ranks that own the tokens
    moe_unpermute        the weighted top-k combine

Nothing is dropped and there is no capacity factor: the buffers are sized by the actual counts, which is why
they must be known on the host (``all_to_all_single`` takes its split sizes as Python ints). That one
device-to-host copy per layer (the counts) is inherent to uneven all-to-all; the layer is therefore not CUDA-graph
capturable, unlike the single-device :class:`wavefront.nn.MoE`.

Autograd: the all-to-alls are an autograd Function whose backward is the reverse all-to-all (splits swapped).
Expert weight gradients are local (each expert lives on one rank) and summed over the tokens of every source
rank. When the dense part is data-parallel over the same ranks with averaged gradients (DDP, FSDP2) and each
rank's loss is a mean over its own tokens, the expert gradients must be divided by P too to equal the
one-process gradient of the global mean loss: ``grad_scale`` (default 1/P) does that in the backward.

:func:`expert_parallel` converts a model in place: every :class:`wavefront.nn.MoEExperts` (inside
:class:`wavefront.nn.MoE`, and the ones ``wavefront.patch`` puts into Hugging Face MoE blocks) becomes an
:class:`ExpertParallelExperts` holding its rank's slice. ``model.state_dict()`` still gives the full (E, ...)
expert weights (an all-gather over the group: every rank must call it) and ``load_state_dict`` accepts full
weights (each rank keeps its slice) as well as local slices.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from wavefront import ops
from wavefront.nn.moe import MoEExperts, expert_counts
from wavefront.parallel._agree import check_agreement, fingerprint
from wavefront.parallel.vocab_parallel import check_group

__all__ = ["ExpertParallelExperts", "all_to_all_rows", "expert_parallel", "expert_parameters"]

_WEIGHTS = ("gate_up_proj", "down_proj")


class _AllToAll(torch.autograd.Function):
    """Rows of x split by in_splits to the ranks, received by out_splits; backward: the reverse exchange."""

    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list[int], in_splits: list[int], group) -> Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, dy: Tensor):
        out_splits, in_splits = ctx.splits
        return _exchange(dy, in_splits, out_splits, ctx.group), None, None, None


def _exchange(x: Tensor, out_splits: list[int], in_splits: list[int], group) -> Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    return out


def all_to_all_rows(x: Tensor, out_splits: list[int], in_splits: list[int], group=None) -> Tensor:
    """Differentiable uneven all-to-all of the rows of x: in_splits[d] rows (in order) go to rank d,
    out_splits[s] rows arrive from rank s. Backward sends the gradient rows back the same way."""
    if len(in_splits) != len(out_splits) or sum(in_splits) != x.shape[0]:
        raise ValueError(f"all_to_all_rows: argument 'in_splits' must sum to x.shape[0] ({x.shape[0]}) and have as "
                         f"many entries as out_splits ({len(out_splits)}), got {in_splits}")
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, dw: Tensor):
        return dw * ctx.scale, None


class ExpertParallelExperts(MoEExperts):
    """This rank's E/P experts of an expert-parallel MoE layer; see the module docstring.

    Same forward signature as :class:`wavefront.nn.MoEExperts`: forward(hidden (T, H), top_k_index (T, k) global
    expert ids, top_k_weights (T, k), counts=None (E,): ignored, the exchanged counts are always those of
    top_k_index) -> (T, H). An index outside [0, E) is dropped (zero contribution), as in ``ops.moe_permute``.
    ``num_experts`` is the global E;
    ``gate_up_proj`` / ``down_proj`` are the local (E/P, ...) slices. ``tokens_per_expert`` counts this rank's
    tokens per global expert (sum it over the group for the layer's totals). Build with :meth:`from_experts`.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, group=None,
                 grad_scale: float | None = None, device=None, dtype=None):
        rank, world = check_group("ExpertParallelExperts", group)
        if num_experts % world:
            raise ValueError(f"ExpertParallelExperts: num_experts ({num_experts}) must be divisible by the "
                             f"expert-parallel group size ({world})")
        super().__init__(num_experts, hidden_size, intermediate_size, device="meta")
        self.group, self.ep_rank, self.ep_size = group, rank, world
        self.num_local_experts = num_experts // world
        self.grad_scale = 1.0 / world if grad_scale is None else float(grad_scale)
        kw = {"device": device, "dtype": dtype}
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_local_experts, 2 * intermediate_size, hidden_size, **kw))
        self.down_proj = nn.Parameter(torch.empty(self.num_local_experts, hidden_size, intermediate_size, **kw))
        self.tokens_per_expert = torch.zeros(num_experts, dtype=torch.int64, device=device)
        self.dropped_assignments = torch.zeros((), dtype=torch.int64, device=device)
        self.register_state_dict_post_hook(_gather_full_experts)
        self.register_load_state_dict_pre_hook(_take_local_slice)

    @classmethod
    def from_experts(cls, experts: MoEExperts, group=None, *, grad_scale: float | None = None
                     ) -> ExpertParallelExperts:
        """This rank's slice of `experts` (copied; the full module is left as it is)."""
        if experts.pad_to != 1:
            raise ValueError(f"ExpertParallelExperts.from_experts: pad_to={experts.pad_to} is not supported "
                             f"(received groups are not padded); use pad_to=1")
        w = experts.gate_up_proj
        new = cls(experts.num_experts, experts.hidden_size, experts.intermediate_size, group=group,
                  grad_scale=grad_scale, device=w.device, dtype=w.dtype)
        lo, hi = new.local_range
        with torch.no_grad():
            new.gate_up_proj.copy_(experts.gate_up_proj[lo:hi])
            new.down_proj.copy_(experts.down_proj[lo:hi])
        return new

    @property
    def local_range(self) -> tuple[int, int]:
        """[first, last + 1) of the global expert ids this rank holds."""
        return self.ep_rank * self.num_local_experts, (self.ep_rank + 1) * self.num_local_experts

    def gather_full(self, local: Tensor) -> Tensor:
        """The full (E, ...) tensor of a per-expert local one (E/P, ...): an expert weight or one of its
        optimizer states, all-gathered over the group (collective)."""
        local = local.detach().contiguous()
        parts = [torch.empty_like(local) for _ in range(self.ep_size)]
        dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts, 0)

    def local_slice(self, value: Tensor) -> Tensor:
        """This rank's rows of a full (E, ...) per-expert tensor (E, 2I, H or E, H, I); anything else as it is."""
        if value.dim() == 3 and value.shape[0] == self.num_experts != self.num_local_experts:
            lo, hi = self.local_range
            return value[lo:hi]
        return value

    def reset_parameters(self) -> None:
        if self.gate_up_proj.device.type != "meta":
            super().reset_parameters()

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor,
                counts: Tensor | None = None) -> Tensor:
        world, n_local, group = self.ep_size, self.num_local_experts, self.group
        # Every rank must exchange the same layout (E, H, dtype): checked once per shape, the same error on every
        # rank instead of an abort inside the backend's all-to-all.
        check_agreement("ExpertParallelExperts", group, hidden_states.device, {
            "num_experts": self.num_experts, "hidden size": hidden_states.shape[-1],
            "dtype fingerprint": fingerprint(hidden_states.dtype, self.gate_up_proj.dtype)})
        # The counts exchanged are always the ones of these indices (a given `counts` may disagree with them, and
        # an invalid index counts for no expert): the rows moe_permute places are then exactly the rows
        # announced to the other ranks, by construction.
        counts = expert_counts(top_k_index, self.num_experts)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
        x_sorted, _, row_map = ops.moe_permute(hidden_states, top_k_index, counts)
        with torch.no_grad():
            self.dropped_assignments.add_((row_map < 0).sum())
        # Per-(source, local expert) counts; then one device-to-host copy of both (the split sizes).
        send_counts = counts.to(torch.int64).contiguous()
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        host = torch.cat([send_counts, recv_counts]).tolist()
        send_splits = [sum(host[d * n_local:(d + 1) * n_local]) for d in range(world)]
        recv_host = host[self.num_experts:]
        recv_splits = [sum(recv_host[s * n_local:(s + 1) * n_local]) for s in range(world)]
        n_rows = x_sorted.shape[0]
        # Dropped assignments (an index outside [0, E)) hold no row: the sent rows are the first sum(counts).
        x_recv = all_to_all_rows(x_sorted[:sum(send_splits)], recv_splits, send_splits, group)
        # Received rows are (source, local expert)-ordered: a stable sort by local expert groups them.
        local_ids = torch.arange(n_local, device=x_recv.device).repeat(world)
        expert_of_row = torch.repeat_interleave(local_ids, recv_counts.to(x_recv.device))
        order = torch.argsort(expert_of_row, stable=True)
        offsets = torch.cumsum(recv_counts.view(world, n_local).sum(0), 0).to(torch.int32)
        x_local = x_recv.index_select(0, order)
        gate_up, down = self.gate_up_proj, self.down_proj
        if self.grad_scale != 1.0:
            gate_up, down = _ScaleGrad.apply(gate_up, self.grad_scale), _ScaleGrad.apply(down, self.grad_scale)
        h = ops.grouped_linear(x_local, gate_up, offsets, activation="swiglu")
        y_local = ops.grouped_linear(h, down, offsets)
        y_recv = y_local.index_select(0, torch.argsort(order))
        y_sorted = all_to_all_rows(y_recv, send_splits, recv_splits, group)
        if y_sorted.shape[0] < n_rows:
            y_sorted = torch.cat([y_sorted, y_sorted.new_zeros((n_rows - y_sorted.shape[0], y_sorted.shape[1]))])
        return ops.moe_unpermute(y_sorted, row_map, top_k_weights)

    def extra_repr(self) -> str:
        lo, hi = self.local_range
        return f"{super().extra_repr()}, experts=[{lo}, {hi}) of ep_size={self.ep_size}"


def _gather_full_experts(module: ExpertParallelExperts, state_dict: dict, prefix: str, local_metadata) -> None:
    """state_dict hook: the full (E, ...) expert weights, all-gathered over the group (collective)."""
    for name in _WEIGHTS:
        key = prefix + name
        if key in state_dict:
            state_dict[key] = module.gather_full(state_dict[key])


def _take_local_slice(module: ExpertParallelExperts, state_dict: dict, prefix: str, local_metadata, strict,
                      missing_keys, unexpected_keys, error_msgs) -> None:
    """load_state_dict pre-hook: full (E, ...) weights are sliced to this rank's experts; local ones pass."""
    for name in _WEIGHTS:
        key = prefix + name
        if key in state_dict:
            state_dict[key] = module.local_slice(state_dict[key])


def expert_parallel(model: nn.Module, group=None, *, grad_scale: float | None = None) -> list[str]:
    """Replace every :class:`wavefront.nn.MoEExperts` in `model` (in place) by its rank's
    :class:`ExpertParallelExperts` slice over `group` (None: the default group). Call it on every rank of the
    group with identical full weights (the same seed or checkpoint). Returns the paths of the replaced modules.
    Patch a Hugging Face model with ``wavefront.patch`` first: its MoE blocks then hold MoEExperts."""
    _, world = check_group("expert_parallel", group)
    found = [(path, m) for path, m in model.named_modules()
             if isinstance(m, MoEExperts) and not isinstance(m, ExpertParallelExperts)]
    for path, m in found:
        if m.num_experts % world:
            raise ValueError(f"expert_parallel: {path} has {m.num_experts} experts, not divisible by the "
                             f"expert-parallel group size ({world})")
    for path, m in found:
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, name, ExpertParallelExperts.from_experts(m, group, grad_scale=grad_scale))
    return [path for path, _ in found]


def expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The expert-parallel Parameters of `model` (each rank's own slices): keep them out of the data-parallel
    gradient reduction of the dense part, e.g. ``fully_shard(module, ignored_params=expert_parameters(model))``.
    A set: iterate it in id() order, which differs between processes, and collectives over its members
    mismatch across ranks; reduce their gradients in model order instead (``model.parameters()`` filtered)."""
    return {p for m in model.modules() if isinstance(m, ExpertParallelExperts) for p in (m.gate_up_proj, m.down_proj)}
