"""Rotary position embedding: validation, one custom op (forward and backward are the same kernel with
the angle negated), autograd, registry entry."""

from __future__ import annotations

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from wavefront import reference, runtime
from wavefront.kernels._scope import op_scope
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import check_same_device, check_same_dtype, check_tensor
from wavefront.ops.cross_entropy import INDEX_DTYPES, values_checkable
from wavefront.shapes import MODELS

POS_DIRECT, POS_IDS, POS_CU_SEQLENS = 0, 1, 2  # kernels/rope.py's codes (importing it would import Triton)


@torch.library.custom_op("wavefront::rope", mutates_args=())
def _rope(q: Tensor, k: Tensor | None, cos: Tensor, sin: Tensor, positions: Tensor | None, pos_mode: int,
          backward: bool) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import rope as kernels  # lazy: Triton-free import

    if pos_mode == POS_CU_SEQLENS and not backward:
        # Here, not in rope(): the op's body runs with real values in eager mode, under torch.compile and
        # on every device, so malformed offsets are refused the same way everywhere.
        check_cu_seqlens(positions, q.shape[0], cos.shape[0])
    with op_scope("rope"):
        q_out, k_out = kernels.rope(q, k, cos, sin, pos_mode, positions, backward)
    return q_out, q.new_empty(0) if k_out is None else k_out


@_rope.register_fake
def _(q, k, cos, sin, positions, pos_mode, backward):
    return torch.empty_like(q), q.new_empty(0) if k is None else torch.empty_like(k)


def _unit_last(t: Tensor | None) -> Tensor | None:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, positions, pos_mode, backward = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.pos_mode = pos_mode
    ctx.backward = backward
    ctx.has_k = k is not None


def _backward(ctx, dq, dk):
    cos, sin, positions = ctx.saved_tensors
    dq_in, dk_in = torch.ops.wavefront.rope(_unit_last(dq), _unit_last(dk) if ctx.has_k else None, cos, sin,
                                            positions, ctx.pos_mode, not ctx.backward)
    return dq_in, dk_in if ctx.has_k else None, None, None, None, None, None


_rope.register_autograd(_backward, setup_context=_setup_context)


def _check(q, k, cos, sin, position_ids, cu_seqlens) -> int:
    op = "rope"
    check_tensor(op, "q", q)
    if q.dim() not in (3, 4):
        raise ValueError(f"{op}: argument 'q' must be [batch, heads, seq, head_dim] (Hugging Face) or "
                         f"[tokens, heads, head_dim] (packed), got shape {tuple(q.shape)}")
    if k is not None:
        check_tensor(op, "k", k, ndim=q.dim())
        check_same_dtype(op, q=q, k=k)
        same = (k.shape[0], k.shape[-1]) == (q.shape[0], q.shape[-1]) and (q.dim() == 3 or k.shape[2] == q.shape[2])
        if not same:
            raise ValueError(f"{op}: argument 'k' must match 'q' in every dim but the heads, got {tuple(k.shape)} "
                             f"for q {tuple(q.shape)}")
    check_tensor(op, "cos", cos)
    check_tensor(op, "sin", sin)
    check_same_dtype(op, cos=cos, sin=sin)
    if cos.shape != sin.shape:
        raise ValueError(f"{op}: argument 'sin' must have the shape of 'cos' {tuple(cos.shape)}, got "
                         f"{tuple(sin.shape)}")
    rotary_dim, head_dim = cos.shape[-1], q.shape[-1]
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(f"{op}: the rotary dim (last dim of 'cos') must be even and in [2, head_dim={head_dim}], "
                         f"got {rotary_dim}")
    check_same_device(op, q=q, k=k, cos=cos, sin=sin, position_ids=position_ids, cu_seqlens=cu_seqlens)
    packed = q.dim() == 3
    seq = q.shape[0] if packed else q.shape[2]
    batch = 1 if packed else q.shape[0]
    if position_ids is not None and cu_seqlens is not None:
        raise ValueError(f"{op}: pass 'position_ids' or 'cu_seqlens', not both")
    if cu_seqlens is not None:
        if not packed:
            raise ValueError(f"{op}: argument 'cu_seqlens' needs the packed layout q [tokens, heads, head_dim], got "
                             f"shape {tuple(q.shape)}")
        check_tensor(op, "cu_seqlens", cu_seqlens, dtypes=INDEX_DTYPES, ndim=1)
        if cu_seqlens.numel() < 2:
            raise ValueError(f"{op}: argument 'cu_seqlens' must hold at least [0, tokens], got {cu_seqlens.numel()} "
                             f"value(s)")
        _check_table(op, cos, "cu_seqlens")
        return POS_CU_SEQLENS
    if position_ids is not None:
        check_tensor(op, "position_ids", position_ids, dtypes=INDEX_DTYPES, min_dim=1)
        ok = tuple(position_ids.shape) in ((seq,), (batch, seq), (1, seq))
        if not ok:
            want = f"({seq},)" if packed else f"({batch}, {seq}), (1, {seq}) or ({seq},)"
            raise ValueError(f"{op}: argument 'position_ids' must have shape {want}, got {tuple(position_ids.shape)}")
        _check_table(op, cos, "position_ids")
        if values_checkable(position_ids) and position_ids.numel():
            if bool((position_ids < 0).any()):
                raise ValueError(f"{op}: argument 'position_ids' must be >= 0")
            _check_positions(op, "position_ids", position_ids.max() + 1, cos.shape[0])
        return POS_IDS
    want = [(seq, rotary_dim)] if packed else [(batch, seq, rotary_dim), (1, seq, rotary_dim), (seq, rotary_dim)]
    if tuple(cos.shape) not in want:
        raise ValueError(f"{op}: argument 'cos' must have shape {' or '.join(str(w) for w in want)} (one row per "
                         f"token), or be a table [max_positions, rotary_dim] with position_ids / cu_seqlens; got "
                         f"{tuple(cos.shape)}")
    return POS_DIRECT


def check_cu_seqlens(cu_seqlens: Tensor, n_tokens: int, n_table_rows: int, *, on_device: bool | None = None) -> None:
    """cu_seqlens must rise from 0 to the token count, and no sequence may outrun the cos/sin table.

    The rule attention applies too. On the CPU the values are read directly (free) and a ValueError names
    the argument. On a GPU the check runs on the device and raises through ``torch._assert_async``: no
    host synchronization, so the error arrives asynchronously as a device-side assertion (the CUDA
    context is then unusable, as with any device assert) instead of the silent garbage it replaces.
    ``on_device`` forces the device form (tests run it on the CPU, where the assert raises at once).
    """
    op = "rope"
    if on_device is None:
        on_device = cu_seqlens.device.type != "cpu"
    if cu_seqlens.device.type == "meta" or isinstance(cu_seqlens, FakeTensor):
        return  # shapes only: no values to check
    diffs = cu_seqlens[1:] - cu_seqlens[:-1]
    if on_device:
        ok = ((cu_seqlens[0] == 0) & (cu_seqlens[-1] == n_tokens) & (diffs >= 0).all()
              & (diffs.max() <= n_table_rows))
        torch._assert_async(ok, f"{op}: argument 'cu_seqlens' must rise from 0 to the token count {n_tokens} "
                                f"with no sequence longer than the {n_table_rows}-row cos/sin table")
        return
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != n_tokens or bool((diffs < 0).any()):
        raise ValueError(f"{op}: argument 'cu_seqlens' must rise from 0 to the token count {n_tokens}, got "
                         f"{cu_seqlens.tolist()}")
    _check_positions(op, "cu_seqlens", diffs.max(), n_table_rows)


def _check_table(op: str, cos: Tensor, by: str) -> None:
    if cos.dim() != 2:
        raise ValueError(f"{op}: with '{by}', 'cos' and 'sin' must be tables [max_positions, rotary_dim], got shape "
                         f"{tuple(cos.shape)}")


def _check_positions(op: str, name: str, needed: Tensor, n_rows: int) -> None:
    if int(needed) > n_rows:
        raise ValueError(f"{op}: argument '{name}' reaches position {int(needed) - 1} but the cos/sin table has "
                         f"{n_rows} rows")


def rope(q: Tensor, k: Tensor | None, cos: Tensor, sin: Tensor, *, position_ids: Tensor | None = None,
         cu_seqlens: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Rotary embedding of q and k (one launch), Hugging Face's ``rotate_half`` convention.

    Layouts: q [batch, heads, seq, head_dim] (HF; any strides with a unit last stride, e.g. a transposed
    [batch, seq, heads, head_dim] view) or packed q [tokens, heads, head_dim]; k the same but for its head
    count (GQA), or None. cos/sin as HF's rotary embedding returns them, [batch, seq, rotary_dim] or
    [seq, rotary_dim] ([tokens, rotary_dim] packed); or tables [max_positions, rotary_dim] indexed by
    ``position_ids`` ([batch, seq] or [seq]; [tokens] packed) or, packed, by the position inside each
    sequence given by ``cu_seqlens`` [n_seqs + 1]. rotary_dim < head_dim rotates the leading rotary_dim
    dims and passes the rest through (partial rotary). Returns (q_rotated, k_rotated); cos/sin get no
    gradient.
    """
    mode = _check(q, k, cos, sin, position_ids, cu_seqlens)
    if q.numel() == 0 or not runtime.uses_triton(q.device):
        if cu_seqlens is not None and not torch.compiler.is_compiling():
            check_cu_seqlens(cu_seqlens, q.shape[0], cos.shape[0])
        return reference.rope(q, k, cos, sin, position_ids=position_ids, cu_seqlens=cu_seqlens)
    positions = position_ids if mode == POS_IDS else cu_seqlens
    q_out, k_out = torch.ops.wavefront.rope(_unit_last(q), _unit_last(k), _unit_last(cos), _unit_last(sin),
                                            positions, mode, False)
    return q_out, (k_out if k is not None else None)


# ---------------------------------------------------------------------------------------------------
# Registry entry. Dims: batch, seq, heads (q), kv_heads, head_dim, rotary (rotary_dim); packed cases use
# batch 1 and lay q out as [tokens, heads, head_dim].


def _angles(positions: Tensor, rotary_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    dims = case.dims
    b, s, hq, hk, d = dims["batch"], dims["seq"], dims["heads"], dims["kv_heads"], dims["head_dim"]
    r = dims.get("rotary", d)
    packed = case.layout.startswith("packed")
    if packed:
        q = randn((b * s, hq, d), dtype, device, gen)
        k = randn((b * s, hk, d), dtype, device, gen)
    elif case.layout == "bshd_view":
        # HF's q_proj(x).view(b, s, h, d).transpose(1, 2): non-contiguous, unit last stride, no copy.
        q = randn((b, s, hq, d), dtype, device, gen).transpose(1, 2)
        k = randn((b, s, hk, d), dtype, device, gen).transpose(1, 2)
    else:
        q = randn((b, hq, s, d), dtype, device, gen)
        k = randn((b, hk, s, d), dtype, device, gen)
    kwargs = {}
    offset = case.options.get("position_offset", 0)
    if case.layout == "packed_cu":
        cuts = torch.tensor([0, *case.options["cu"], b * s])
        kwargs["cu_seqlens"] = cuts.to(torch.int32).to(device)
        cos, sin = _angles(torch.arange(b * s), r)
    elif case.layout in ("ids", "packed_ids"):
        n_pos = case.options["table"]
        shape = (b * s,) if packed else (b, s)
        kwargs["position_ids"] = torch.randint(0, n_pos, shape, generator=gen).to(device)
        cos, sin = _angles(torch.arange(n_pos), r)
    elif packed:
        cos, sin = _angles(torch.randint(0, 4096, (b * s,), generator=gen), r)
    else:
        cos, sin = _angles(torch.arange(s).expand(b, s) + offset, r)
        if case.options.get("cos_2d"):
            cos, sin = cos[0], sin[0]
    # HF casts cos/sin to the activations' dtype before applying them.
    return OpInputs((q, k, cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)), kwargs, (0, 1))


def _tokens_and_heads(case: Case) -> tuple[int, int, int]:
    dims = case.dims
    return dims["batch"] * dims["seq"], dims["heads"] + dims["kv_heads"], dims["head_dim"]


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    # Read q and k, write both; cos and sin once per token (in the input dtype).
    tokens, heads, d = _tokens_and_heads(case)
    return (2 * tokens * heads * d + 2 * tokens * case.dims.get("rotary", d)) * itemsize(dtype)


def _flops(case: Case, mode: Mode) -> float:
    tokens, heads, d = _tokens_and_heads(case)
    return 3 * tokens * heads * case.dims.get("rotary", d)  # two multiplies and an add per rotated element


def _case(name, reason, batch, seq, heads, kv_heads, head_dim, rotary=None, layout="contiguous", **options):
    dims = {"batch": batch, "seq": seq, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
    if rotary is not None:
        dims["rotary"] = rotary
    return Case(name, reason, dims, options, layout=layout)


def _bench(model: str, seq: int) -> Case:
    m = MODELS[model]
    return _case(f"{model}_{seq}", f"{model}: {m.n_heads} q / {m.n_kv_heads} kv heads of {m.head_dim}, seq {seq}",
                 1, seq, m.n_heads, m.n_kv_heads, m.head_dim)


SPECS = (
    OpSpec(
        name="rope",
        fn=rope,
        reference=reference.rope,
        eager=reference.rope_eager,
        make_inputs=_inputs,
        cases=(
            _case("hf", "HF layout, cos/sin [batch, seq, dim]", 2, 16, 4, 4, 64),
            _case("gqa_cos2d", "GQA (8 q / 2 kv heads), cos/sin [seq, dim] broadcast over the batch",
                  2, 12, 8, 2, 64, cos_2d=True),
            _case("partial", "partial rotary: 32 of 64 dims rotate, the tail passes through", 2, 8, 4, 2, 64, 32),
            _case("npow2", "3 q heads / 1 kv head of 80 dims: masked heads and half-dims", 1, 7, 3, 1, 80),
            _case("bshd_view", "q, k as transposed [batch, seq, heads, dim] views (no copy)", 2, 9, 4, 2, 32,
                  layout="bshd_view"),
            _case("position_ids", "a 64-row cos/sin table gathered by position_ids [batch, seq]", 2, 10, 4, 2, 32,
                  layout="ids", table=64),
            _case("large_positions", "positions 8000+: angles far from 0 in every pair", 1, 6, 2, 2, 128,
                  position_offset=8000),
            _case("packed", "packed [tokens, heads, dim] with per-token cos/sin rows", 1, 20, 4, 2, 64,
                  layout="packed"),
            _case("packed_ids", "packed with position_ids [tokens] into a table", 1, 20, 4, 2, 64,
                  layout="packed_ids", table=32),
            _case("packed_cu_seqlens", "packed sequences of 5, 7 and 8 tokens: positions restart at each",
                  1, 20, 4, 2, 64, layout="packed_cu", cu=[5, 12]),
            _case("packed_partial", "packed with partial rotary (GPT-NeoX style 25%)", 1, 12, 2, 2, 64, 16,
                  layout="packed"),
        ),
        bench_cases=(_bench("llama3-8b", 8192), _bench("llama3-70b", 8192), _bench("gemma2-9b", 8192)),
        flops=_flops,
        min_bytes=_bytes,
        description="rotary embedding of q and k in one launch (HF rotate_half; packed; partial)",
    ),
)
