"""Mixture-of-experts layer on the MoE ops: router -> permute -> grouped experts -> weighted combine.

State dict keys are transformers' (5.x) sparse MoE blocks': ``gate.weight`` (E, H) (plus DeepSeek-V3's
``gate.e_score_correction_bias``), fused expert weights ``experts.gate_up_proj`` (E, 2I, H) and
``experts.down_proj`` (E, H, I), and DeepSeek-V3's ``shared_experts.{gate,up,down}_proj.weight``. So a
Mixtral / Qwen3-MoE / DeepSeek-V3 block's checkpoint loads into :class:`MoE` and back.

The forward has no host sync of its own (counts and offsets stay on the device; shapes are static), so it
captures in one graph once the grouped GEMM it calls has none either.

KPI: every :class:`MoEExperts` (inside :class:`MoE`, and the ones ``wavefront.patch`` puts into Hugging
Face models) adds the tokens routed to each expert into its ``tokens_per_expert`` buffer (int64 (E,),
on the device, not in the state dict). :func:`tokens_per_expert` reads and resets them for a whole model:
call it once per optimizer step (one host sync, at report time). Activation checkpointing re-runs the
forward and counts its tokens again.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wavefront import ops
from wavefront.nn.mlp import SwiGLUMLP


def expert_counts(indices: Tensor, num_experts: int) -> Tensor:
    """Tokens per expert (E,) int32 from (T, k) indices, on the device (a scatter-add: no host sync). An index
    outside [0, E) counts for no expert (``ops.moe_permute`` drops it): it lands in a scratch slot E."""
    flat = indices.reshape(-1).to(torch.int64)
    flat = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    return torch.zeros(num_experts + 1, dtype=torch.int32, device=indices.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))[:num_experts]


def group_limited_bias(scores: Tensor, bias: Tensor | None, n_group: int, topk_group: int) -> Tensor:
    """DeepSeek-V3's group-limited routing as a (T, E) selection bias for ``ops.moe_router``: experts in
    n_group equal groups; a group's score is the sum of its two best ``scores + bias``; each token chooses
    among the experts of its topk_group best groups only (the others get -inf). No gradient (selection)."""
    with torch.no_grad():
        key = scores.float() if bias is None else scores.float() + bias
        n_tokens, n_experts = key.shape
        per_group = n_experts // n_group
        group_scores = key.view(n_tokens, n_group, per_group).topk(min(2, per_group), dim=-1).values.sum(-1)
        keep = torch.zeros(n_tokens, n_group, dtype=torch.bool, device=key.device)
        keep.scatter_(1, group_scores.topk(topk_group, dim=-1, sorted=False).indices, True)
        mask = torch.zeros(n_tokens, n_experts, dtype=key.dtype, device=key.device).masked_fill(
            ~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        return mask if bias is None else mask + bias


class MoEExperts(nn.Module):
    """E SwiGLU experts as fused 3-D weights: ``down_proj[e] @ swiglu(gate_up_proj[e] @ x)``.

    forward(hidden (T, H), top_k_index (T, k), top_k_weights (T, k), counts=None) -> (T, H): the signature of
    transformers' experts modules. counts (E,) when the router gave them, else computed on the device.
    pad_to pads each expert's group of rows to a multiple (tile-aligned grouped GEMM). An assignment whose
    index is outside [0, E) (or that counts has no room for) is dropped, as ``ops.moe_permute`` does: it adds
    nothing to the output, and ``dropped_assignments`` (int64 scalar buffer on the device, not in the
    state_dict) counts it without a host sync.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, pad_to: int = 1, device=None,
                 dtype=None):
        super().__init__()
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.pad_to = pad_to
        kw = {"device": device, "dtype": dtype}
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **kw))
        buffer_device = None if device is not None and torch.device(device).type == "meta" else device
        self.register_buffer("tokens_per_expert", torch.zeros(num_experts, dtype=torch.int64, device=buffer_device),
                             persistent=False)
        self.register_buffer("dropped_assignments", torch.zeros((), dtype=torch.int64, device=buffer_device),
                             persistent=False)
        if self.gate_up_proj.device.type != "meta":
            self.reset_parameters()

    @classmethod
    def from_parameters(cls, gate_up_proj: nn.Parameter, down_proj: nn.Parameter, *, pad_to: int = 1) -> MoEExperts:
        """An experts module holding these very Parameters (how ``wavefront.patch`` swaps transformers' in)."""
        num_experts, two_i, hidden = gate_up_proj.shape
        new = cls(num_experts, hidden, two_i // 2, pad_to=pad_to, device="meta")
        new.gate_up_proj, new.down_proj = gate_up_proj, down_proj
        new.tokens_per_expert = torch.zeros(num_experts, dtype=torch.int64, device=gate_up_proj.device)
        new.dropped_assignments = torch.zeros((), dtype=torch.int64, device=gate_up_proj.device)
        return new

    def reset_parameters(self) -> None:
        nn.init.normal_(self.gate_up_proj, std=1.0 / math.sqrt(self.hidden_size))
        nn.init.normal_(self.down_proj, std=1.0 / math.sqrt(self.intermediate_size))

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor,
                counts: Tensor | None = None) -> Tensor:
        if counts is None:
            counts = expert_counts(top_k_index, self.num_experts)
        with torch.no_grad():
            self.tokens_per_expert.add_(counts)
        x_sorted, offsets, row_map = ops.moe_permute(hidden_states, top_k_index, counts, pad_to=self.pad_to)
        with torch.no_grad():
            self.dropped_assignments.add_((row_map < 0).sum())
        h = ops.grouped_linear(x_sorted, self.gate_up_proj, offsets, activation="swiglu")
        y_sorted = ops.grouped_linear(h, self.down_proj, offsets)
        return ops.moe_unpermute(y_sorted, row_map, top_k_weights)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, pad_to={self.pad_to}")


class MoERouter(nn.Module):
    """Router logits ``x @ weight.T`` (in fp32 when ``fp32``: DeepSeek-V3 keeps its router in fp32) and
    ``wavefront.ops.moe_router``. forward(x (T, H)) -> (logits, weights (T, k), indices, counts, aux_loss).
    n_group > 1 with topk_group < n_group: DeepSeek-V3's group-limited selection (:func:`group_limited_bias`)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, *, score: str = "softmax",
                 order: str = "softmax_topk", normalize: bool = True, score_bias: bool = False,
                 routed_scaling_factor: float = 1.0, aux_loss_coef: float = 0.0, z_loss_coef: float = 0.0,
                 fp32: bool = False, n_group: int = 1, topk_group: int = 1, device=None, dtype=None):
        super().__init__()
        if n_group < 1 or num_experts % n_group or not 1 <= topk_group <= n_group:
            raise ValueError(f"MoERouter: n_group ({n_group}) must divide num_experts ({num_experts}) and "
                             f"topk_group ({topk_group}) be in [1, n_group]")
        self.n_group, self.topk_group = n_group, topk_group
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.score, self.order, self.normalize = score, order, normalize
        self.routed_scaling_factor = routed_scaling_factor
        self.aux_loss_coef, self.z_loss_coef, self.fp32 = aux_loss_coef, z_loss_coef, fp32
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device,
                                               dtype=torch.float32 if fp32 else dtype))
        if score_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, dtype=torch.float32,
                                                                        device=device))
        else:
            self.e_score_correction_bias = None
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(hidden_size))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        x = x.reshape(-1, self.hidden_size)
        logits = F.linear(x.float(), self.weight.float()) if self.fp32 else F.linear(x, self.weight)
        bias = self.e_score_correction_bias
        if self.topk_group < self.n_group:
            scores = torch.sigmoid(logits) if self.score == "sigmoid" else torch.softmax(logits.float(), -1)
            bias = group_limited_bias(scores, bias, self.n_group, self.topk_group)
        weights, indices, counts, aux = ops.moe_router(
            logits, self.top_k, score=self.score, order=self.order, normalize=self.normalize, bias=bias,
            aux_loss_coef=self.aux_loss_coef, z_loss_coef=self.z_loss_coef)
        if self.routed_scaling_factor != 1.0:
            weights = weights * self.routed_scaling_factor
        return logits, weights, indices, counts, aux

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"score={self.score!r}, order={self.order!r}, normalize={self.normalize}")


class MoE(nn.Module):
    """A sparse mixture-of-experts MLP: ``sum_j w_j expert_{i_j}(x) (+ shared_experts(x))``.

    hidden, intermediate: the model and per-expert widths. num_experts, top_k: E and k. Router options
    (score, order, normalize, score_bias, routed_scaling_factor, aux_loss_coef, z_loss_coef, router_fp32,
    n_group, topk_group) as :class:`MoERouter`. shared_expert: the intermediate width of an always-on SwiGLU expert
    (DeepSeek-V3: moe_intermediate_size * n_shared_experts), or None. pad_to: see :class:`MoEExperts`.

    forward(x (..., H)) -> (..., H). After each forward, ``aux_loss`` holds the router's loss (scalar, in the
    graph: add it to the training loss) and ``router_logits`` the (T, E) logits.
    """

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, *, score: str = "softmax",
                 order: str = "softmax_topk", normalize: bool = True, score_bias: bool = False,
                 routed_scaling_factor: float = 1.0, aux_loss_coef: float = 0.0, z_loss_coef: float = 0.0,
                 router_fp32: bool = False, n_group: int = 1, topk_group: int = 1, shared_expert: int | None = None,
                 pad_to: int = 1, device=None, dtype=None):
        super().__init__()
        for name, value in (("hidden", hidden), ("intermediate", intermediate), ("num_experts", num_experts),
                            ("top_k", top_k), ("pad_to", pad_to)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MoE: argument '{name}' must be an int >= 1, got {value!r}")
        if top_k > num_experts:
            raise ValueError(f"MoE: argument 'top_k' must be <= num_experts ({num_experts}), got {top_k}")
        if shared_expert is not None and (not isinstance(shared_expert, int) or shared_expert < 1):
            raise ValueError(f"MoE: argument 'shared_expert' must be None or an int >= 1 (its intermediate "
                             f"width), got {shared_expert!r}")
        self.hidden, self.num_experts, self.top_k = hidden, num_experts, top_k
        self.gate = MoERouter(hidden, num_experts, top_k, score=score, order=order, normalize=normalize,
                              score_bias=score_bias, routed_scaling_factor=routed_scaling_factor,
                              aux_loss_coef=aux_loss_coef, z_loss_coef=z_loss_coef, fp32=router_fp32, n_group=n_group,
                              topk_group=topk_group, device=device, dtype=dtype)
        self.experts = MoEExperts(num_experts, hidden, intermediate, pad_to=pad_to, device=device, dtype=dtype)
        self.shared_experts = (SwiGLUMLP(hidden, shared_expert, device=device, dtype=dtype)
                               if shared_expert is not None else None)
        self.aux_loss: Tensor | None = None
        self.router_logits: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.hidden:
            raise ValueError(f"MoE: input's last dim must be hidden={self.hidden}, got shape {tuple(x.shape)}")
        flat = x.reshape(-1, self.hidden)
        logits, weights, indices, counts, aux = self.gate(flat)
        self.aux_loss, self.router_logits = aux, logits
        y = self.experts(flat, indices, weights, counts).view(x.shape)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y

    def extra_repr(self) -> str:
        return f"hidden={self.hidden}, num_experts={self.num_experts}, top_k={self.top_k}"


def tokens_per_expert(model: nn.Module, *, reset: bool = True) -> dict[str, list[int]]:
    """Tokens routed to each expert since the last reset, per MoE experts module of `model` (its path ->
    one count per expert). One host sync per module; reset=True zeroes the counters (once per step)."""
    out = {}
    for path, module in model.named_modules():
        if isinstance(module, MoEExperts):
            out[path] = module.tokens_per_expert.tolist()
            if reset:
                module.tokens_per_expert.zero_()
    return out
