"""Attention: validation, torch.library custom ops with fake kernels, autograd, and the registry entry.

``attention(q, k, v, *, causal=False, scale=None, cu_seqlens=None, max_seqlen=None)`` takes the Hugging
Face layout [batch, heads, seq, head_dim] (any strides; a non-unit head_dim stride is copied once), GQA
and MQA (k/v with fewer heads, dividing q's), head dims up to 256, and packed variable-length sequences:

    q [1, H, total, D], k and v [1, H_kv, total, D], cu_seqlens int32/int64 [n_seqs + 1] with
    cu_seqlens[0] == 0, non-decreasing, cu_seqlens[-1] == total; sequence b is rows
    cu_seqlens[b]:cu_seqlens[b+1] and attends only within itself (causally if causal=True).

Query and key lengths must match (self-attention; causal is top-left = bottom-right then). fp64 inputs
and CPU runs without the Triton interpreter use the PyTorch reference.

Varlen checks: on a GPU with ``max_seqlen`` given by the caller (as flash-attn's varlen API takes it),
nothing is read on the host: cu_seqlens is checked on the device (starts at 0, never decreases, ends at
the packed length, no sequence longer than max_seqlen) and a violation raises through
``torch._assert_async`` (asynchronous device assert; no host sync, so the step stays graph-capturable).
Without max_seqlen, or on the CPU where it is free, cu_seqlens is read on the host (one small copy per
call, inside the custom op so torch.compile sees no data-dependent Python) and errors are ValueErrors.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import check_same_device, check_same_dtype, check_tensor
from wavefront.shapes import MODELS

OP = "attention"
MAX_HEAD_DIM = 256
_FLOAT = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _resolve_max_seqlen(cu_seqlens: Tensor, max_seqlen: int, total: int, *, on_device: bool | None = None) -> int:
    """Validate cu_seqlens against the packed length and return the longest sequence (see the module
    docstring): on the device without a host sync when the caller gave max_seqlen, else on the host.
    ``on_device`` forces the device form (tests run it on the CPU, where the assert raises at once)."""
    if on_device is None:
        on_device = cu_seqlens.device.type != "cpu" and max_seqlen >= 0
    if on_device:
        if max_seqlen < 0:
            raise ValueError(f"{OP}: the device-side cu_seqlens check needs 'max_seqlen'")
        diffs = cu_seqlens[1:] - cu_seqlens[:-1]
        ok = (cu_seqlens[0] == 0) & (cu_seqlens[-1] == total) & (diffs >= 0).all() & (diffs.max() <= max_seqlen)
        torch._assert_async(ok, f"{OP}: 'cu_seqlens' must start at 0, never decrease, end at the packed length "
                                f"{total} (q.shape[2]), and hold no sequence longer than 'max_seqlen' ({max_seqlen})")
        return max_seqlen
    bounds = cu_seqlens.tolist()
    lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    if bounds[0] != 0 or bounds[-1] != total or min(lengths) < 0:
        shown = bounds if len(bounds) <= 8 else [*bounds[:4], "...", *bounds[-2:]]
        raise ValueError(f"{OP}: 'cu_seqlens' must start at 0, never decrease, and end at the packed length "
                         f"{total} (q.shape[2]); got {shown}")
    longest = max(lengths)
    if max_seqlen >= 0 and max_seqlen < longest:
        raise ValueError(f"{OP}: 'max_seqlen' ({max_seqlen}) is smaller than the longest sequence in "
                         f"'cu_seqlens' ({longest})")
    return max(longest, max_seqlen)


@torch.library.custom_op("wavefront::attention_fwd", mutates_args=())
def _attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor | None, max_seqlen: int, causal: bool,
                   scale: float, deterministic: bool = True) -> tuple[Tensor, Tensor]:
    # deterministic only travels to the backward (setup_context); the forward is the same either way.
    from wavefront.kernels import attention as kernels
    from wavefront.kernels._launch import op_scope

    if cu_seqlens is not None:
        max_seqlen = _resolve_max_seqlen(cu_seqlens, max_seqlen, q.shape[2])
    with op_scope(OP):
        return kernels.attention_fwd(q, k, v, causal, scale, cu_seqlens, max_seqlen)


@_attention_fwd.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, causal, scale, deterministic=True):
    B, H, S, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, S), dtype=torch.float32)


@torch.library.custom_op("wavefront::attention_bwd", mutates_args=())
def _attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse2: Tensor, cu_seqlens: Tensor | None,
                   max_seqlen: int, causal: bool, scale: float, deterministic: bool = True
                   ) -> tuple[Tensor, Tensor, Tensor]:
    from wavefront.kernels import attention as kernels
    from wavefront.kernels._launch import op_scope

    if cu_seqlens is not None:
        max_seqlen = _resolve_max_seqlen(cu_seqlens, max_seqlen, q.shape[2])
    with op_scope(OP):
        return kernels.attention_bwd(do, q, k, v, o, lse2, causal, scale, cu_seqlens, max_seqlen,
                                     deterministic=deterministic)


@_attention_bwd.register_fake
def _(do, q, k, v, o, lse2, cu_seqlens, max_seqlen, causal, scale, deterministic=True):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, max_seqlen, causal, scale, *rest = inputs
    o, lse2 = output
    ctx.deterministic = rest[0] if rest else True
    ctx.save_for_backward(q, k, v, o, lse2, cu_seqlens)
    ctx.max_seqlen = max_seqlen
    ctx.causal = causal
    ctx.scale = scale


def _backward(ctx, do, d_lse2):
    q, k, v, o, lse2, cu_seqlens = ctx.saved_tensors
    do = do if do.stride(-1) == 1 else do.contiguous()
    dq, dk, dv = torch.ops.wavefront.attention_bwd(do, q, k, v, o, lse2, cu_seqlens, ctx.max_seqlen, ctx.causal,
                                                   ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(q, k, v, causal, scale, cu_seqlens, max_seqlen, deterministic=True) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(OP, name, t, dtypes=_FLOAT, ndim=4)
    check_same_dtype(OP, q=q, k=k, v=v)
    check_same_device(OP, q=q, k=k, v=v, cu_seqlens=cu_seqlens)
    if k.shape != v.shape:
        raise ValueError(f"{OP}: 'k' and 'v' must have the same shape [batch, kv_heads, seq, head_dim], got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    (B, H, S, D), (Bk, Hk, Sk, Dk) = q.shape, k.shape
    if Dk != D:
        raise ValueError(f"{OP}: head_dim of 'k'/'v' ({Dk}) must equal head_dim of 'q' ({D}); the layout is "
                         f"[batch, heads, seq, head_dim]")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"{OP}: head_dim must be in [1, {MAX_HEAD_DIM}], got {D}")
    if Bk != B:
        raise ValueError(f"{OP}: 'k'/'v' batch ({Bk}) must equal 'q' batch ({B})")
    if Hk == 0 or H % Hk:
        raise ValueError(f"{OP}: the number of q heads ({H}) must be a multiple of the number of k/v heads ({Hk}) "
                         "(GQA/MQA); is the layout [batch, heads, seq, head_dim]?")
    if Sk != S:
        raise ValueError(f"{OP}: 'q' and 'k'/'v' must have the same sequence length (self-attention), got {S} and "
                         f"{Sk}; is the layout [batch, heads, seq, head_dim]?")
    for name, flag in (("causal", causal), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise TypeError(f"{OP}: argument '{name}' must be a bool, got {type(flag).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float)
                              or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"{OP}: 'scale' must be a positive finite number or None, got {scale!r}")
    if cu_seqlens is None:
        if max_seqlen is not None:
            raise ValueError(f"{OP}: 'max_seqlen' is only meaningful with 'cu_seqlens'")
        return
    check_tensor(OP, "cu_seqlens", cu_seqlens, dtypes=(torch.int32, torch.int64), ndim=1)
    if cu_seqlens.numel() < 2:
        raise ValueError(f"{OP}: 'cu_seqlens' must hold at least two offsets (one sequence), got "
                         f"{cu_seqlens.numel()}")
    if B != 1:
        raise ValueError(f"{OP}: packed sequences (cu_seqlens) take q of shape [1, heads, total, head_dim], got "
                         f"batch {B}")
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int)
                                   or max_seqlen < 0):
        raise ValueError(f"{OP}: 'max_seqlen' must be a non-negative int or None, got {max_seqlen!r}")


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: float | None = None,
              cu_seqlens: Tensor | None = None, max_seqlen: int | None = None, deterministic: bool = True) -> Tensor:
    """softmax(q k^T * scale) v on [batch, heads, seq, head_dim]; see the module docstring for GQA and the
    packed layout. scale defaults to 1/sqrt(head_dim). Output has q's dtype and shape.

    deterministic=False: the backward accumulates dQ with fp32 atomics in one pass with dK and dV (5 matrix
    products instead of 7), so dQ may differ in its last bits from run to run; the default writes every
    gradient exactly once."""
    _check(q, k, v, causal, scale, cu_seqlens, max_seqlen, deterministic)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if q.numel() == 0 or q.dtype == torch.float64 or not runtime.uses_triton(q.device):
        return reference.attention(q, k, v, causal, scale, cu_seqlens, max_seqlen)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()  # the kernels read offsets b and b + 1 at unit stride
    out, _ = torch.ops.wavefront.attention_fwd(q, k, v, cu_seqlens, -1 if max_seqlen is None else max_seqlen,
                                               causal, scale, deterministic)
    return out


# ---------------------------------------------------------------------------------------------------
# Registry entry. dims: batch, heads, kv_heads, seq, head_dim; options: causal, seqlens (packed
# sequence lengths: q is [1, heads, sum(seqlens), head_dim]), scale, q_scale (input magnitude), layout
# "bshd" (q/k/v as transposed views of [batch, seq, heads, head_dim], as Hugging Face builds them).


def _seqlens(case: Case) -> list[int]:
    if "seqlens" in case.options:
        return list(case.options["seqlens"])
    return [case.dims["seq"]] * case.dims.get("batch", 1)


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    d = case.dims
    opts = dict(case.options)
    seqlens = opts.pop("seqlens", None)
    q_scale = opts.pop("q_scale", 1.0)
    B, S = (1, sum(seqlens)) if seqlens is not None else (d["batch"], d["seq"])
    shapes = ((B, d["heads"], S, d["head_dim"]), (B, d["kv_heads"], S, d["head_dim"]))

    def make(shape, scale=1.0):
        if case.layout == "bshd":
            b, h, s, hd = shape
            return randn((b, s, h, hd), dtype, device, gen, scale).transpose(1, 2)
        return randn(shape, dtype, device, gen, scale)

    q, k, v = make(shapes[0], q_scale), make(shapes[1]), make(shapes[1])
    if seqlens is not None:
        cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        opts["cu_seqlens"] = cu
        opts["max_seqlen"] = max(seqlens)
    return OpInputs((q, k, v), opts, (0, 1, 2))


def _flops(case: Case, mode: Mode) -> float:
    d = case.dims
    fwd = sum(4 * d["heads"] * s * s * d["head_dim"] for s in _seqlens(case))
    if case.options.get("causal"):
        fwd /= 2
    return fwd if mode == "fwd" else 2.5 * fwd


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    d = case.dims
    tokens = sum(_seqlens(case))
    q_like = d["heads"] * tokens * d["head_dim"] * itemsize(dtype)
    kv_like = d["kv_heads"] * tokens * d["head_dim"] * itemsize(dtype)
    lse = 4 * d["heads"] * tokens
    # fwd: read q, k, v; write o and lse. bwd: read q, k, v, o, dO, lse; write dq, dk, dv.
    if mode == "fwd":
        return 2 * q_like + 2 * kv_like + lse
    return 4 * q_like + 4 * kv_like + lse


def _case(name, reason, batch, heads, kv_heads, seq, head_dim, slow=False, layout="contiguous", **options):
    return Case(name, reason, {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq,
                               "head_dim": head_dim}, options, layout=layout, slow=slow)


CASES = (
    _case("mha_d64", "multi-head, non-causal, lengths a multiple of every tile", 2, 2, 2, 64, 64),
    _case("causal_odd", "causal, 100 rows: ragged tail and the diagonal inside one tile", 1, 2, 2, 100, 64,
          causal=True),
    _case("gqa_causal", "GQA (4 q heads per k/v head), causal, 77 rows", 1, 4, 1, 77, 64, causal=True),
    _case("gqa_2", "GQA with 2 k/v heads: the head mapping h // group", 1, 4, 2, 48, 64),
    _case("d128_causal", "head_dim 128, causal", 1, 2, 1, 64, 128, causal=True),
    _case("d96", "head_dim 96: padded to 128 with masked columns", 1, 2, 2, 40, 96),
    _case("sharp", "q scaled by 6: peaked softmax, the running max moves between key tiles", 1, 2, 2, 64, 64,
          q_scale=6.0),
    _case("varlen_causal", "packed sequences of 17, 47 and 36 tokens, causal, GQA", 1, 4, 2, 0, 64, causal=True,
          seqlens=(17, 47, 36)),
    _case("varlen_empty", "packed sequences including an empty one and a one-token one", 1, 2, 2, 0, 64,
          seqlens=(20, 0, 1, 33)),
    _case("bshd_layout", "q/k/v as transposed views of [batch, seq, heads, dim] (Hugging Face)", 2, 2, 2, 33, 64,
          layout="bshd", causal=True),
    _case("d256", "head_dim 256 (Gemma 2)", 1, 2, 1, 64, 256, slow=True, causal=True),
    _case("long_causal", "512 tokens: many tiles per row", 1, 2, 1, 512, 64, slow=True, causal=True),
    _case("long_d128", "384 tokens at head_dim 128, non-causal", 1, 2, 2, 384, 128, slow=True),
)


def _bench_case(model: str, seq: int, causal: bool) -> Case:
    m = MODELS[model]
    batch = max(1, 16384 // seq)
    return _case(f"{model}_s{seq}{'_causal' if causal else ''}",
                 f"{m.n_heads} heads / {m.n_kv_heads} kv heads, head_dim {m.head_dim}, {batch} x {seq} tokens",
                 batch, m.n_heads, m.n_kv_heads, seq, m.head_dim, causal=causal)


BENCH_CASES = (
    _bench_case("llama3-8b", 8192, False),
    _bench_case("llama3-8b", 8192, True),
    _bench_case("llama3-70b", 8192, True),
    _bench_case("qwen2.5-7b", 4096, True),
    _bench_case("gemma2-9b", 8192, True),
    _bench_case("gpt3-175b", 2048, True),
)

SPECS = (
    OpSpec(
        name=OP,
        fn=attention,
        reference=reference.attention,
        eager=reference.attention_sdpa_math,
        make_inputs=_inputs,
        cases=CASES,
        bench_cases=BENCH_CASES,
        flops=_flops,
        min_bytes=_bytes,
        description="FlashAttention-2-style attention: GQA, causal, packed varlen; fwd + bwd",
    ),
)
