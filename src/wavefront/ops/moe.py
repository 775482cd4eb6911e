"""Mixture-of-experts routing and permutation: validation, custom ops with fake kernels, autograd, registry.

    weights, indices, counts, aux_loss = moe_router(logits, top_k, ...)       (T, E) router logits
    x_sorted, offsets, row_map = moe_permute(x, indices, counts, pad_to=1)    expert-contiguous rows
    y_sorted = grouped_linear(...)(x_sorted, ..., offsets)                    the experts
    out = moe_unpermute(y_sorted, row_map, weights)                           weighted combine

No host sync anywhere (counts and offsets stay on the device; every shape is static: x_sorted has the
upper bound T*k + E*(pad_to-1) rows), and no float atomics (deterministic run to run).
"""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.kernels._scope import op_scope
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import as_rows, check_choice, check_same_device, check_tensor

SCORES = ("softmax", "sigmoid")
ORDERS = ("softmax_topk", "topk_softmax")
INDEX_DTYPES = (torch.int32, torch.int64)


def _stat(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------------
# Router


@torch.library.custom_op("wavefront::moe_router_fwd", mutates_args=())
def _router_fwd(logits: Tensor, bias: Tensor | None, top_k: int, sigmoid: bool, topk_first: bool,
                normalize: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    from wavefront.kernels import moe_router as kernels  # lazy: Triton-free import

    with op_scope("moe_router"):
        return kernels.moe_router_fwd(logits, bias, top_k, sigmoid, topk_first, normalize)


@_router_fwd.register_fake
def _(logits, bias, top_k, sigmoid, topk_first, normalize):
    n_tokens, n_experts = logits.shape
    stat = _stat(logits.dtype)
    return (logits.new_empty((n_tokens, top_k), dtype=stat), logits.new_empty((n_tokens, top_k), dtype=torch.int64),
            logits.new_empty((n_experts,), dtype=torch.int32), logits.new_empty((n_experts,), dtype=stat),
            logits.new_empty((n_tokens,), dtype=stat))


@torch.library.custom_op("wavefront::moe_router_bwd", mutates_args=())
def _router_bwd(logits: Tensor, indices: Tensor, weights: Tensor, dweights: Tensor, dpsum: Tensor, dlse: Tensor,
                sigmoid: bool, topk_first: bool, normalize: bool) -> Tensor:
    from wavefront.kernels import moe_router as kernels  # lazy: Triton-free import

    with op_scope("moe_router"):
        return kernels.moe_router_bwd(logits, indices, weights, dweights, dpsum, dlse, sigmoid, topk_first,
                                      normalize)


@_router_bwd.register_fake
def _(logits, indices, weights, dweights, dpsum, dlse, sigmoid, topk_first, normalize):
    return torch.empty_like(logits)


def _router_setup(ctx, inputs, output):
    logits, _, _, sigmoid, topk_first, normalize = inputs
    weights, indices, counts, psum, lse = output
    ctx.mark_non_differentiable(indices, counts)
    ctx.save_for_backward(logits, indices, weights)
    ctx.flags = (sigmoid, topk_first, normalize)


def _router_backward(ctx, dweights, _dindices, _dcounts, dpsum, dlse):
    logits, indices, weights = ctx.saved_tensors
    stat = weights.dtype
    dweights = torch.zeros_like(weights) if dweights is None else dweights.to(stat).contiguous()
    dpsum = weights.new_zeros(logits.shape[1]) if dpsum is None else dpsum.to(stat).contiguous()
    dlse = weights.new_zeros(logits.shape[0]) if dlse is None else dlse.to(stat).contiguous()
    dlogits = torch.ops.wavefront.moe_router_bwd(logits, indices, weights, dweights, dpsum, dlse, *ctx.flags)
    return dlogits, None, None, None, None, None


_router_fwd.register_autograd(_router_backward, setup_context=_router_setup)


def _router_losses(counts: Tensor, psum: Tensor, lse: Tensor, n_tokens: int, aux_loss_coef: float,
                   z_loss_coef: float) -> Tensor:
    """aux_loss_coef * E * sum_e (counts_e / T) (psum_e / T) + z_loss_coef * mean_t lse_t^2 (E-sized torch ops)."""
    rows = max(n_tokens, 1)
    aux = (counts.to(psum.dtype) / rows * psum / rows).sum() * (aux_loss_coef * counts.shape[0])
    return aux + z_loss_coef * lse.pow(2).sum() / rows


def moe_router(logits: Tensor, top_k: int, *, score: str = "softmax", order: str = "softmax_topk",
               normalize: bool = True, bias: Tensor | None = None, aux_loss_coef: float = 0.0,
               z_loss_coef: float = 0.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Top-k routing of (T, E) router logits, fused: scores, selection, weights, counts and losses.

    Returns (weights (T, k) fp32, indices (T, k) int64, counts (E,) int32 on the device, aux_loss fp32 scalar).

    score: "softmax" (Mixtral, Qwen-MoE) or "sigmoid" (DeepSeek-V3). order: "softmax_topk" selects on the
    scores; "topk_softmax" (softmax only) selects on the logits and softmaxes the k selected ones. normalize:
    divide the selected scores by their sum. bias (E,) or (T, E): added to the selection key only (DeepSeek-V3's
    load-balancing correction; a (T, E) bias with -inf outside each token's groups gives group-limited
    routing). aux_loss = aux_loss_coef * E * sum_e f_e P_e (Switch/Mixtral: f_e = tokens
    routed to e / T, P_e = mean router probability of e; for sigmoid scores the probability is s / sum(s))
    + z_loss_coef * mean(logsumexp(logits)^2) (ST-MoE). Gradients reach logits through weights and aux_loss.
    Equal keys go to the lowest expert index (torch.topk's order for distinct values; deterministic).
    """
    op = "moe_router"
    check_tensor(op, "logits", logits, ndim=2)
    n_tokens, n_experts = logits.shape
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= n_experts:
        raise ValueError(f"{op}: argument 'top_k' must be an int in [1, {n_experts}] (the number of experts, "
                         f"logits.shape[1]), got {top_k!r}")
    check_choice(op, "score", score, SCORES)
    check_choice(op, "order", order, ORDERS)
    if order == "topk_softmax" and score != "softmax":
        raise ValueError(f"{op}: order='topk_softmax' needs score='softmax', got score={score!r}")
    if not isinstance(normalize, bool):
        raise TypeError(f"{op}: argument 'normalize' must be True or False, got {normalize!r}")
    for name, coef in (("aux_loss_coef", aux_loss_coef), ("z_loss_coef", z_loss_coef)):
        if isinstance(coef, bool) or not isinstance(coef, int | float):
            raise TypeError(f"{op}: argument '{name}' must be a float, got {type(coef).__name__}")
    if bias is not None:
        check_tensor(op, "bias", bias, min_dim=1)
        if tuple(bias.shape) not in ((n_experts,), (n_tokens, n_experts)):
            raise ValueError(f"{op}: argument 'bias' must have shape ({n_experts},) (one per expert) or "
                             f"{(n_tokens, n_experts)} (one per token and expert, like logits), got "
                             f"{tuple(bias.shape)}")
        check_same_device(op, logits=logits, bias=bias)
    if logits.numel() == 0 or not runtime.uses_triton(logits.device):
        return reference.moe_router(logits, top_k, score=score, order=order, normalize=normalize, bias=bias,
                                    aux_loss_coef=aux_loss_coef, z_loss_coef=z_loss_coef)
    if bias is not None:
        bias = as_rows(bias) if bias.dim() == 2 else bias.contiguous()
    weights, indices, counts, psum, lse = torch.ops.wavefront.moe_router_fwd(
        as_rows(logits), bias, top_k, score == "sigmoid", order == "topk_softmax", normalize)
    return weights, indices, counts, _router_losses(counts, psum, lse, n_tokens, aux_loss_coef, z_loss_coef)


# ---------------------------------------------------------------------------------------------------
# Permutation and combine


@torch.library.custom_op("wavefront::moe_permute_fwd", mutates_args=())
def _permute_fwd(x: Tensor, indices: Tensor, starts: Tensor, counts: Tensor, top_k: int, n_rows: int
                 ) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import moe_permute as kernels  # lazy: Triton-free import

    with op_scope("moe_permute"):
        row_map = kernels.moe_row_map(indices, starts, counts, n_rows)
        x_sorted, _ = kernels.moe_scatter_rows(x, row_map, n_rows, top_k, zero_fill=n_rows > row_map.numel())
        return x_sorted, row_map


@_permute_fwd.register_fake
def _(x, indices, starts, counts, top_k, n_rows):
    return x.new_empty((n_rows, x.shape[1])), indices.new_empty(indices.shape)


@torch.library.custom_op("wavefront::moe_gather_rows", mutates_args=())
def _gather_rows(src: Tensor, row_map: Tensor, weights: Tensor | None, n_tokens: int, top_k: int) -> Tensor:
    from wavefront.kernels import moe_permute as kernels  # lazy: Triton-free import

    with op_scope("moe_permute" if weights is None else "moe_unpermute"):
        return kernels.moe_gather_rows(src, row_map, n_tokens, top_k, weights)


@_gather_rows.register_fake
def _(src, row_map, weights, n_tokens, top_k):
    return src.new_empty((n_tokens, src.shape[1]))


@torch.library.custom_op("wavefront::moe_unpermute_bwd", mutates_args=())
def _unpermute_bwd(dout: Tensor, y_sorted: Tensor, row_map: Tensor, weights: Tensor, top_k: int
                   ) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import moe_permute as kernels  # lazy: Triton-free import

    with op_scope("moe_unpermute"):
        n_rows = y_sorted.shape[0]
        dy, dw = kernels.moe_scatter_rows(dout, row_map, n_rows, top_k, weights, y_sorted,
                                          zero_fill=n_rows > row_map.numel())
        assert dw is not None  # y given: the weight gradient is computed
        return dy, dw


@_unpermute_bwd.register_fake
def _(dout, y_sorted, row_map, weights, top_k):
    return torch.empty_like(y_sorted), torch.empty_like(weights)


def _permute_setup(ctx, inputs, output):
    x, _, _, _, top_k, _ = inputs
    _, row_map = output
    ctx.mark_non_differentiable(row_map)
    ctx.save_for_backward(row_map)
    ctx.top_k, ctx.n_tokens = top_k, x.shape[0]


def _permute_backward(ctx, dx_sorted, _drow_map):
    (row_map,) = ctx.saved_tensors
    dx = torch.ops.wavefront.moe_gather_rows(as_rows(dx_sorted), row_map, None, ctx.n_tokens, ctx.top_k)
    return dx, None, None, None, None, None


_permute_fwd.register_autograd(_permute_backward, setup_context=_permute_setup)


def _gather_setup(ctx, inputs, output):
    src, row_map, weights, _, top_k = inputs
    ctx.save_for_backward(src, row_map, weights)
    ctx.top_k = top_k


def _gather_backward(ctx, dout):
    y_sorted, row_map, weights = ctx.saved_tensors
    if weights is None:
        raise RuntimeError("moe_gather_rows: the backward of the unweighted gather is not used by any op")
    dy, dw = torch.ops.wavefront.moe_unpermute_bwd(as_rows(dout), y_sorted, row_map, weights, ctx.top_k)
    return dy, None, dw, None, None


_gather_rows.register_autograd(_gather_backward, setup_context=_gather_setup)


def _check_routing(op: str, name: str, t, n_tokens: int | None = None) -> None:
    check_tensor(op, name, t, dtypes=INDEX_DTYPES, ndim=2 if name == "indices" else 1)
    if n_tokens is not None and t.shape[0] != n_tokens:
        raise ValueError(f"{op}: argument '{name}' must have {n_tokens} rows (one per token of x), got shape "
                         f"{tuple(t.shape)}")


def moe_permute(x: Tensor, indices: Tensor, counts: Tensor, *, pad_to: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Copy token rows into expert-contiguous groups for a grouped GEMM, in one pass, no host sync.

    x (T, H); indices (T, k) expert of each (token, slot); counts (E,) tokens per expert (moe_router's).
    Returns (x_sorted (rows, H), offsets (E,) int32 cumulative END offsets of the groups, as torch._grouped_mm
    and wavefront.ops.grouped_linear take them, row_map (T*k,) int64: the x_sorted row of assignment t*k+j).
    Stable: inside a group, rows keep token order. pad_to > 1 pads every group to a multiple of pad_to
    (tile-aligned groups); rows = T*k + E*(pad_to-1) is a static upper bound and padding rows are zero.
    Backward: dx[t] = sum_j dx_sorted[row_map[t*k+j]] (a gather, no atomics).

    Invalid routing never reads or writes outside a buffer, and costs no host sync to detect: an assignment
    whose index is outside [0, E) (E or -1, say), or that finds its expert's group full because counts[e] is
    smaller than the assignments to e, is *dropped*: row_map = -1, no row of x_sorted, zero contribution in
    moe_unpermute, zero gradient. ``(row_map < 0).sum()`` counts them on the device. A negative count is
    taken as 0. Counts larger than the indices give leave rows of their group that no assignment writes
    (unspecified values, which the grouped GEMM's weight gradient reads): pass the counts of these indices
    (moe_router's, or ``wavefront.nn.moe.expert_counts``).
    """
    op = "moe_permute"
    check_tensor(op, "x", x, ndim=2)
    _check_routing(op, "indices", indices, x.shape[0])
    _check_routing(op, "counts", counts)
    if isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 1:
        raise ValueError(f"{op}: argument 'pad_to' must be an int >= 1, got {pad_to!r}")
    check_same_device(op, x=x, indices=indices, counts=counts)
    n_tokens, top_k = indices.shape
    if x.numel() == 0 or indices.numel() == 0 or not runtime.uses_triton(x.device):
        return reference.moe_permute(x, indices, counts, pad_to=pad_to)
    offsets, starts = reference.moe_offsets(counts, pad_to)
    n_rows = n_tokens * top_k + counts.shape[0] * (pad_to - 1)
    x_sorted, row_map = torch.ops.wavefront.moe_permute_fwd(as_rows(x), indices.reshape(-1).to(torch.int64),
                                                            starts, counts.contiguous(), top_k, n_rows)
    return x_sorted, offsets, row_map


def moe_unpermute(y_sorted: Tensor, row_map: Tensor, weights: Tensor) -> Tensor:
    """Combine the experts' rows back per token: out[t] = sum_j weights[t, j] * y_sorted[row_map[t*k+j]].

    One pass, fp32 accumulation rounded once to y_sorted's dtype, deterministic (a gather, no atomics).
    Backward: dy_sorted[row_map[a]] = weights[a] * dout[t] (zero on padding rows) and
    dweights[t, j] = <dout[t], y_sorted[row_map[t*k+j]]>, in one scatter pass.
    An entry of row_map outside [0, y_sorted rows) (-1: moe_permute dropped the assignment) adds exactly 0
    (also with a NaN weight), reads and writes nothing, and gets dweights 0. Rows of y_sorted that no entry
    names get a zero gradient when y_sorted has padding rows (more rows than entries), else an unspecified
    one (zero-filling would cost a write pass on the hot path; moe_permute's rows past offsets[-1] are
    ignored by grouped_linear).
    """
    op = "moe_unpermute"
    check_tensor(op, "y_sorted", y_sorted, ndim=2)
    _check_routing(op, "row_map", row_map)
    check_tensor(op, "weights", weights, ndim=2)
    if row_map.shape[0] != weights.numel():
        raise ValueError(f"{op}: argument 'row_map' must have weights.numel() = {weights.numel()} entries (one per "
                         f"(token, slot)), got shape {tuple(row_map.shape)}")
    if y_sorted.shape[0] < row_map.shape[0]:
        raise ValueError(f"{op}: argument 'y_sorted' must have at least {row_map.shape[0]} rows (one per "
                         f"assignment), got shape {tuple(y_sorted.shape)}")
    check_same_device(op, y_sorted=y_sorted, row_map=row_map, weights=weights)
    n_tokens, top_k = weights.shape
    if y_sorted.numel() == 0 or weights.numel() == 0 or not runtime.uses_triton(y_sorted.device):
        return reference.moe_unpermute(y_sorted, row_map, weights)
    return torch.ops.wavefront.moe_gather_rows(as_rows(y_sorted), row_map.to(torch.int64),
                                               weights.reshape(-1).contiguous(), n_tokens, top_k)


# ---------------------------------------------------------------------------------------------------
# Registry entries. dims: n_tokens T, n_experts E, top_k k, hidden H.


def _routing(case: Case, gen) -> tuple[Tensor, Tensor]:
    """Random distinct experts per token (CPU), and the tokens per expert."""
    n_tokens, n_experts, top_k = case.dims["n_tokens"], case.dims["n_experts"], case.dims["top_k"]
    indices = torch.rand(n_tokens, n_experts, generator=gen).argsort(dim=-1)[:, :top_k]
    flat = indices.reshape(-1)
    counts = torch.zeros(n_experts, dtype=torch.int32).scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return indices, counts


def _router_inputs(case: Case, dtype, device, gen) -> OpInputs:
    opts = dict(case.options)
    n_tokens, n_experts = case.dims["n_tokens"], case.dims["n_experts"]
    if case.layout == "ties":
        # Small integers: many exactly equal logits, so the lowest-index rule decides.
        logits = torch.randint(-2, 3, (n_tokens, n_experts), generator=gen).to(dtype)
    else:
        logits = (torch.randn(n_tokens, 2 * n_experts, generator=gen) * 2.0).to(dtype)
        logits = logits[:, :n_experts] if case.layout == "strided" else logits[:, ::2].contiguous()
    if opts.pop("with_bias", False):
        opts["bias"] = (torch.randn(n_experts, generator=gen) * 0.2).to(device)
    return OpInputs((logits.to(device), case.dims["top_k"]), opts, (0,))


def _permute_inputs(case: Case, dtype, device, gen) -> OpInputs:
    indices, counts = _routing(case, gen)
    x = torch.randn(case.dims["n_tokens"], case.dims["hidden"], generator=gen).to(device=device, dtype=dtype)
    return OpInputs((x, indices.to(device), counts.to(device)), dict(case.options), (0,))


def _unpermute_inputs(case: Case, dtype, device, gen) -> OpInputs:
    indices, counts = _routing(case, gen)
    n_tokens, hidden = case.dims["n_tokens"], case.dims["hidden"]
    _, _, row_map = reference.moe_permute(torch.zeros(n_tokens, 1), indices, counts, pad_to=case.options.get(
        "pad_to", 1))
    n_rows = row_map.numel() + counts.numel() * (case.options.get("pad_to", 1) - 1)
    y_sorted = torch.randn(n_rows, hidden, generator=gen).to(device=device, dtype=dtype)
    weights = torch.rand(n_tokens, case.dims["top_k"], generator=gen).to(device)  # fp32, as routers give them
    return OpInputs((y_sorted, row_map.to(device), weights), {}, (0, 2))


def _tk(c: Case) -> int:
    return c.dims["n_tokens"] * c.dims["top_k"]


def _router_bytes(c: Case, dtype: torch.dtype, mode: Mode) -> int:
    te = c.dims["n_tokens"] * c.dims["n_experts"] * itemsize(dtype)
    # fwd: logits in; fp32 weights, int64 indices, fp32 lse out. bwd: logits, indices, weights, dweights in;
    # dlogits out.
    return te + _tk(c) * 12 + c.dims["n_tokens"] * 4 if mode == "fwd" else 2 * te + _tk(c) * 16


def _permute_bytes(c: Case, dtype: torch.dtype, mode: Mode) -> int:
    # Each (token, slot) row read once and written once, plus the 8-byte index and row map entries.
    return 2 * _tk(c) * c.dims["hidden"] * itemsize(dtype) + 16 * _tk(c)


def _unpermute_bytes(c: Case, dtype: torch.dtype, mode: Mode) -> int:
    rows = _tk(c) * c.dims["hidden"] * itemsize(dtype)
    out = c.dims["n_tokens"] * c.dims["hidden"] * itemsize(dtype)
    # fwd: y rows, row map, weights in; out written. bwd: dout and y rows in; dy rows and dweights out.
    return rows + out + 12 * _tk(c) if mode == "fwd" else 2 * rows + out + 16 * _tk(c)


def _dims(n_tokens: int, n_experts: int, top_k: int, hidden: int = 0) -> dict[str, int]:
    return {"n_tokens": n_tokens, "n_experts": n_experts, "top_k": top_k, "hidden": hidden}


#: Benchmark shapes: 4096 tokens per micro-batch through one MoE layer of a published model.
_MODELS: dict[str, dict[str, int]] = {
    "mixtral-8x7b": _dims(4096, 8, 2, 4096),
    "qwen3-30b-a3b": _dims(4096, 128, 8, 2048),
    "deepseek-v3": _dims(4096, 256, 8, 7168),
}

_ROUTER_OPTIONS: dict[str, dict[str, object]] = {
    "mixtral-8x7b": {"aux_loss_coef": 0.02},
    "qwen3-30b-a3b": {"normalize": True, "aux_loss_coef": 0.001},
    "deepseek-v3": {"score": "sigmoid", "with_bias": True},
}

_AUX = {"aux_loss_coef": 0.5, "z_loss_coef": 0.1}

ROUTER_CASES = (
    Case("mixtral", "softmax, top-2 of 8, renormalized, aux and z losses", _dims(24, 8, 2), _AUX),
    Case("qwen_no_norm", "softmax top-3 of 12 (non-power-of-two experts) without renormalization",
         _dims(20, 12, 3), {"normalize": False, **_AUX}),
    Case("topk_softmax", "top-k on the logits, softmax over the selected (Mixtral's original order)",
         _dims(16, 8, 2), {"order": "topk_softmax", **_AUX}),
    Case("deepseek_sigmoid", "sigmoid scores, selection bias, renormalized, aux loss on s / sum(s)",
         _dims(20, 16, 4), {"score": "sigmoid", "with_bias": True, **_AUX}),
    Case("sigmoid_no_norm", "sigmoid scores as weights, no bias", _dims(12, 8, 2),
         {"score": "sigmoid", "normalize": False, **_AUX}),
    Case("ties", "integer logits: exact ties broken by the lowest expert index", _dims(16, 8, 3), _AUX,
         layout="ties"),
    Case("one_token", "a single token", _dims(1, 8, 2), _AUX),
    Case("top_1", "Switch-style top-1", _dims(16, 6, 1), _AUX),
    Case("strided", "logits a column slice of a wider tensor (row stride 2E)", _dims(16, 8, 2), _AUX,
         layout="strided"),
    Case("many_experts", "256 experts, top-8 (DeepSeek-V3's router width): 8 rows per program, 3 programs",
         _dims(20, 256, 8), {"score": "sigmoid", "with_bias": True, **_AUX}),
)

PERMUTE_CASES = (
    Case("top2", "8 experts, top-2", _dims(24, 8, 2, 64)),
    Case("npow2_hidden", "hidden 100 (masked tail), 5 experts top-3", _dims(10, 5, 3, 100)),
    Case("padded", "groups padded to multiples of 8 (zero rows between groups)", _dims(12, 4, 2, 32), {"pad_to": 8}),
    Case("one_token", "a single token", _dims(1, 4, 2, 16)),
    Case("wide_rows", "rows of 5000: two 4096-element chunks per row", _dims(3, 4, 2, 5000)),
)

SPECS = (
    OpSpec(
        name="moe_router",
        fn=moe_router,
        reference=reference.moe_router,
        make_inputs=_router_inputs,
        cases=ROUTER_CASES,
        bench_cases=tuple(Case(name, f"{name}'s router on 4096 tokens", {k: v for k, v in d.items() if k != "hidden"},
                               _ROUTER_OPTIONS[name]) for name, d in _MODELS.items()),
        # exp, sum, divide per score; k max-reductions with compare/select; bwd ~ 2x fwd.
        flops=lambda c, mode: (6 + 3 * c.dims["top_k"]) * c.dims["n_tokens"] * c.dims["n_experts"] * (
            1 if mode == "fwd" else 2),
        min_bytes=_router_bytes,
        description="top-k router: scores, selection, weights, expert counts, aux and z losses in one pass",
    ),
    OpSpec(
        name="moe_permute",
        fn=moe_permute,
        reference=reference.moe_permute,
        make_inputs=_permute_inputs,
        cases=PERMUTE_CASES,
        bench_cases=tuple(Case(name, f"{name}'s dispatch of 4096 tokens", d) for name, d in _MODELS.items()),
        flops=lambda c, mode: 0 if mode == "fwd" else _tk(c) * c.dims["hidden"],
        min_bytes=_permute_bytes,
        description="token rows -> expert-contiguous groups (stable, optional padding), offsets and row map",
    ),
    OpSpec(
        name="moe_unpermute",
        fn=moe_unpermute,
        reference=reference.moe_unpermute,
        make_inputs=_unpermute_inputs,
        cases=PERMUTE_CASES,
        bench_cases=tuple(Case(name, f"{name}'s combine of 4096 tokens", d) for name, d in _MODELS.items()),
        flops=lambda c, mode: 2 * _tk(c) * c.dims["hidden"] * (1 if mode == "fwd" else 2),
        min_bytes=_unpermute_bytes,
        description="expert rows -> tokens, weighted by the routing weights, fp32 accumulation",
    ),
)
