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

FP8 output (``quantize="block1x128" | "block1x32"``, ``fp8_dtype``, ``pow2_scale``: the names of
``ops.quantize``): the forward's epilogue also writes O in FP8 for the FP8 o_proj, and the op returns
``(out, out_fp8, out_scale)``, bit for bit ``ops.quantize(out.transpose(1, 2).reshape(B, S, H * D),
dtype=fp8_dtype, scaling=quantize, pow2_scale=pow2_scale)``: out_fp8 [B, S, H * D], out_scale
[B, S, H * D / G] fp32, quantized from O as rounded to its dtype. A scale group (1 x 128, DeepSeek-V3's
activation tiles; 1 x 32, MXFP8's blocks, with pow2_scale=True for E8M0 scales) must not cross a head
(head_dim % G == 0): one program holds one head's D values of a token. "rowwise" and "tensorwise" need
the amax over every head of a token (or of the whole output), which no single program sees: refused.
out keeps its gradient; out_fp8 and out_scale carry none (the backward reads out, unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.archs import Arch, compiles_fp8_e4m3
from wavefront.kernels._scope import op_scope
from wavefront.ops._fused_quantize import register_fp8_autograd
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import check_choice, check_same_device, check_same_dtype, check_tensor
from wavefront.ops.quantize import FORMATS, check_fp8_target
from wavefront.shapes import MODELS

OP = "attention"
MAX_HEAD_DIM = 256
_FLOAT = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: FP8 output scalings the epilogue computes: scale group (columns) of each, within one head.
FP8_OUT_GROUPS = {"block1x128": 128, "block1x32": 32}


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
    from wavefront.kernels import attention as kernels  # lazy: Triton-free import
    from wavefront.kernels import attention_fa3, attention_gluon  # lazy: Triton-free import

    if cu_seqlens is not None:
        max_seqlen = _resolve_max_seqlen(cu_seqlens, max_seqlen, q.shape[2])
    with op_scope(OP):
        if attention_fa3.requested():  # opt-in, sm_90 only: FA3's schedule; compiled and inspected, never run on a GPU
            return attention_fa3.attention_fwd(q, k, v, causal, scale, cu_seqlens)
        if attention_gluon.requested():  # opt-in, sm_90 only: compiled and inspected, not yet run on a GPU
            return attention_gluon.attention_fwd(q, k, v, causal, scale, cu_seqlens)
        return kernels.attention_fwd(q, k, v, causal, scale, cu_seqlens, max_seqlen)


@_attention_fwd.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, causal, scale, deterministic=True):
    B, H, S, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, S), dtype=torch.float32)


@torch.library.custom_op("wavefront::attention_fwd_fp8", mutates_args=())
def _attention_fwd_fp8(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor | None, max_seqlen: int, causal: bool,
                       scale: float, deterministic: bool, scaling: str, fp8_dtype: str,
                       pow2_scale: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """attention_fwd plus the FP8 copy of O and its scales (see the module docstring)."""
    from wavefront.kernels import attention as kernels  # lazy: Triton-free import

    check_fp8_target(OP, q.device)  # in the op body: torch.compile does not trace runtime.arch
    if cu_seqlens is not None:
        max_seqlen = _resolve_max_seqlen(cu_seqlens, max_seqlen, q.shape[2])
    with op_scope(OP):
        return kernels.attention_fwd(q, k, v, causal, scale, cu_seqlens, max_seqlen,
                                     fp8_dtype=reference.FP8_FORMATS[fp8_dtype], fp8_group=FP8_OUT_GROUPS[scaling],
                                     fp8_pow2=pow2_scale)


@_attention_fwd_fp8.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, causal, scale, deterministic, scaling, fp8_dtype, pow2_scale):
    B, H, S, D = q.shape
    return (torch.empty_like(q), q.new_empty((B, H, S), dtype=torch.float32),
            q.new_empty((B, S, H * D), dtype=reference.FP8_FORMATS[fp8_dtype]),
            q.new_empty((B, S, H * D // FP8_OUT_GROUPS[scaling]), dtype=torch.float32))


@torch.library.custom_op("wavefront::attention_bwd", mutates_args=())
def _attention_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse2: Tensor, cu_seqlens: Tensor | None,
                   max_seqlen: int, causal: bool, scale: float, deterministic: bool = True,
                   fp32_grads: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """fp32_grads: dq, dk, dv in float32 whatever the inputs' dtype (partials a caller sums: ring attention)."""
    from wavefront.kernels import attention as kernels  # lazy: Triton-free import

    if cu_seqlens is not None:
        max_seqlen = _resolve_max_seqlen(cu_seqlens, max_seqlen, q.shape[2])
    with op_scope(OP):
        return kernels.attention_bwd(do, q, k, v, o, lse2, causal, scale, cu_seqlens, max_seqlen,
                                     deterministic=deterministic, grad_dtype=torch.float32 if fp32_grads else None)


@_attention_bwd.register_fake
def _(do, q, k, v, o, lse2, cu_seqlens, max_seqlen, causal, scale, deterministic=True, fp32_grads=False):
    dtype = torch.float32 if fp32_grads else None
    return torch.empty_like(q, dtype=dtype), torch.empty_like(k, dtype=dtype), torch.empty_like(v, dtype=dtype)


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


# the FP8 copy of O is an inference of O: no gradient through it, nor through the three options
register_fp8_autograd(_attention_fwd_fp8, _setup_context, _backward)


def _check_fp8_output(q, quantize, fp8_dtype, pow2_scale) -> None:
    if quantize in ("rowwise", "tensorwise"):
        raise ValueError(f"{OP}: quantize={quantize!r} needs the amax over every head of a token"
                         f"{' and every token' if quantize == 'tensorwise' else ''}, and the fused epilogue sees "
                         f"one head's head_dim values per program; use quantize='block1x128' or 'block1x32' "
                         f"(scale groups inside one head), or wavefront.ops.quantize on the output")
    check_choice(OP, "quantize", quantize, tuple(FP8_OUT_GROUPS))
    check_choice(OP, "fp8_dtype", fp8_dtype, FORMATS)
    if not isinstance(pow2_scale, bool):
        raise TypeError(f"{OP}: argument 'pow2_scale' must be a bool, got {type(pow2_scale).__name__}")
    group, head_dim = FP8_OUT_GROUPS[quantize], q.shape[-1]
    if head_dim % group:
        raise ValueError(f"{OP}: quantize={quantize!r} needs head_dim divisible by {group} (a scale group must not "
                         f"cross a head), got head_dim {head_dim}")
    if q.dtype == torch.float64:
        raise TypeError(f"{OP}: quantize needs q/k/v of dtype float32, bfloat16 or float16 (as "
                        "wavefront.ops.quantize), got float64")


def _check(q, k, v, causal, scale, cu_seqlens, max_seqlen, deterministic=True, quantize=None, fp8_dtype="e4m3",
           pow2_scale=False) -> None:
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
    if quantize is not None:
        _check_fp8_output(q, quantize, fp8_dtype, pow2_scale)
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
              cu_seqlens: Tensor | None = None, max_seqlen: int | None = None, deterministic: bool = True,
              quantize: str | None = None, fp8_dtype: str = "e4m3",
              pow2_scale: bool = False) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """softmax(q k^T * scale) v on [batch, heads, seq, head_dim]; see the module docstring for GQA and the
    packed layout. scale defaults to 1/sqrt(head_dim). Output has q's dtype and shape.

    deterministic=False: the backward accumulates dQ with fp32 atomics in one pass with dK and dV (5 matrix
    products instead of 7), so dQ may differ in its last bits from run to run; the default writes every
    gradient exactly once.

    quantize: "block1x128" or "block1x32" returns (out, out_fp8, out_scale), O also quantized in the
    forward's epilogue exactly as ops.quantize would quantize it (module docstring)."""
    _check(q, k, v, causal, scale, cu_seqlens, max_seqlen, deterministic, quantize, fp8_dtype, pow2_scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if q.numel() == 0 or q.dtype == torch.float64 or not runtime.uses_triton(q.device):
        out = reference.attention(q, k, v, causal, scale, cu_seqlens, max_seqlen)
        return out if quantize is None else (out, *_quantize_output(out, quantize, fp8_dtype, pow2_scale))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()  # the kernels read offsets b and b + 1 at unit stride
    max_seqlen = -1 if max_seqlen is None else max_seqlen
    if quantize is not None:
        out, _, out_fp8, out_scale = torch.ops.wavefront.attention_fwd_fp8(
            q, k, v, cu_seqlens, max_seqlen, causal, scale, deterministic, quantize, fp8_dtype, pow2_scale)
        return out, out_fp8, out_scale
    out, _ = torch.ops.wavefront.attention_fwd(q, k, v, cu_seqlens, max_seqlen, causal, scale, deterministic)
    return out


def _quantize_output(out: Tensor, scaling: str, fp8_dtype: str, pow2_scale: bool,
                     quantize=reference.fp8_quantize) -> tuple[Tensor, Tensor]:
    """The unfused form of the FP8 output: `quantize` (the reference's, or eager's) on O's [B, S, H * D] view."""
    B, H, S, D = out.shape
    return quantize(out.detach().transpose(1, 2).reshape(B, S, H * D), dtype=fp8_dtype, scaling=scaling,
                    pow2_scale=pow2_scale)


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
    # fwd: read q, k, v; write o and lse (and the FP8 copy of o, one byte per element, and its fp32 scales).
    # bwd: read q, k, v, o, dO, lse; write dq, dk, dv.
    if mode == "fwd":
        fp8 = 0
        if case.options.get("quantize"):
            elems = d["heads"] * tokens * d["head_dim"]
            fp8 = elems + 4 * elems // FP8_OUT_GROUPS[case.options["quantize"]]
        return 2 * q_like + 2 * kv_like + lse + fp8
    return 4 * q_like + 4 * kv_like + lse


def _reference(q, k, v, causal=False, scale=None, cu_seqlens=None, max_seqlen=None, *, quantize=None, **fp8):
    """reference.attention. With quantize the registry's accuracy rule judges O (and the gradients) only:
    the FP8 copy is a function of O as rounded to q's dtype, which a float64 reference does not have; its
    bit-identity to ops.quantize is tests/ops/test_attention_fp8_output.py's."""
    return reference.attention(q, k, v, causal, scale, cu_seqlens, max_seqlen)


def _eager(q, k, v, causal=False, scale=None, cu_seqlens=None, max_seqlen=None, *, quantize=None,
           fp8_dtype="e4m3", pow2_scale=False):
    """PyTorch's math SDPA, then (quantize) the unfused FP8 casts a user writes on its [B, S, H * D] view."""
    out = reference.attention_sdpa_math(q, k, v, causal, scale, cu_seqlens, max_seqlen)
    if quantize is None:
        return out
    return out, *_quantize_output(out, quantize, fp8_dtype, pow2_scale, reference.fp8_quantize_eager)


def _fp8_targets(options) -> Callable[[Arch], bool] | None:
    """Where a case's FP8 output compiles: the FNUZ formats on MI300 (gfx942) only, the OCP formats wherever
    Triton has FP8 (not sm_80); no restriction without the FP8 output."""
    if not options.get("quantize"):
        return None
    if options.get("fp8_dtype", "e4m3").endswith("fnuz"):
        return lambda arch: arch.name == "gfx942"
    return compiles_fp8_e4m3


def _case(name, reason, batch, heads, kv_heads, seq, head_dim, slow=False, layout="contiguous", **options):
    return Case(name, reason, {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq,
                               "head_dim": head_dim}, options, layout=layout, slow=slow, targets=_fp8_targets(options))


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
    _case("fp8out_mx", "FP8 output in the epilogue: 1x32 groups, power-of-two scales, GQA, causal, ragged", 1, 4,
          2, 40, 64, causal=True, quantize="block1x32", pow2_scale=True),
    _case("d256", "head_dim 256 (Gemma 2)", 1, 2, 1, 64, 256, slow=True, causal=True),
    _case("long_causal", "512 tokens: many tiles per row", 1, 2, 1, 512, 64, slow=True, causal=True),
    _case("long_d128", "384 tokens at head_dim 128, non-causal", 1, 2, 2, 384, 128, slow=True),
)


def _bench_case(model: str, seq: int, causal: bool, **fp8) -> Case:
    m = MODELS[model]
    batch = max(1, 16384 // seq)
    suffix = f"_fp8out_{fp8['quantize'].removeprefix('block')}" if fp8 else ""
    suffix += "_fnuz" if fp8.get("fp8_dtype", "").endswith("fnuz") else ""
    return _case(f"{model}_s{seq}{'_causal' if causal else ''}{suffix}",
                 f"{m.n_heads} heads / {m.n_kv_heads} kv heads, head_dim {m.head_dim}, {batch} x {seq} tokens"
                 f"{', O also quantized to FP8 in the epilogue' if fp8 else ''}",
                 batch, m.n_heads, m.n_kv_heads, seq, m.head_dim, causal=causal, **fp8)


BENCH_CASES = (
    _bench_case("llama3-8b", 8192, False),
    _bench_case("llama3-8b", 8192, True),
    _bench_case("llama3-70b", 8192, True),
    _bench_case("qwen2.5-7b", 4096, True),
    _bench_case("gemma2-9b", 8192, True),
    _bench_case("gpt3-175b", 2048, True),
    # The FP8 output for the FP8 o_proj: DeepSeek-V3's 1x128 activation tiles and MXFP8's 1x32 blocks.
    _bench_case("llama3-8b", 8192, True, quantize="block1x128"),
    _bench_case("llama3-8b", 8192, True, quantize="block1x32", pow2_scale=True),
    _bench_case("llama3-8b", 8192, True, quantize="block1x128", fp8_dtype="e4m3fnuz"),  # MI300's format
)

SPECS = (
    OpSpec(
        name=OP,
        fn=attention,
        reference=_reference,
        eager=_eager,
        make_inputs=_inputs,
        cases=CASES,
        bench_cases=BENCH_CASES,
        flops=_flops,
        min_bytes=_bytes,
        description="FlashAttention-2-style attention: GQA, causal, packed varlen; fwd + bwd",
    ),
)
