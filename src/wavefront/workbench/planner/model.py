"""What the cost model needs to know about a model: parameters per layer, FLOPs, activation bytes.

Notation (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4): s sequence length, b micro-batch size,
h hidden size, a attention heads, t tensor-parallel size, L layers, V vocabulary, f FFN hidden size.
We generalise the paper's GPT formulas (multi-head attention, f = 4h, dropout, materialised softmax) to
grouped-query attention (KV heads a_kv, head dim Q: q_dim = a*Q, kv_dim = a_kv*Q), gated MLPs and models
without dropout; with the GPT shape every function below reduces to the paper's numbers, which
tests/workbench/planner/test_planner_memory.py checks term by term.

Activation bytes stored per layer for one micro-batch (16-bit activations, 1-byte dropout masks), derived
the paper's way by listing the tensors backward needs:

- norms: the inputs of the two norms, 2 x 2sbh;
- attention block: the QKV projection input 2sbh; Q 2*s*b*q_dim; K and V 2*2*s*b*kv_dim; the
  attention output (input of the output projection) 2*s*b*q_dim; the dropout mask after the block sbh.
  A materialised attention core adds the softmax output 2*a*s^2*b, and with dropout its mask a*s^2*b and
  output 2*a*s^2*b (the paper's 5as^2b). Flash attention keeps instead a float32 log-sum-exp per query
  row and head (4*a*s*b);
- MLP: the first linear's input 2sbh; plain: activation input and output 2*2*s*b*f; gated: gate and up
  outputs 2*2*s*b*f and the product fed to the down projection 2*s*b*f; the dropout mask sbh.

Kernels (ModelSpec.kernels): the list above is what fused norm and gated-activation kernels keep (Megatron,
wavefront-patched models). Hugging Face's eager modules keep more, listed from the tensors autograd saves
(workbench.bench.memory_measure): each RMSNorm keeps its float32 input 4sbh and the normalized bf16 copy 2sbh instead of
the bf16 input (+4sbh per norm, +8sbh per layer), and a gated MLP keeps the gate projection's output (the
activation's input), the activation's output, the up projection's output and their product, 8sbf instead
of 6sbf (+2sbf). kernels="eager" adds these; a plain GELU MLP is the same in both.

GPT check (q_dim = kv_dim = h, f = 4h): attention 11sbh + 5as^2b, MLP 19sbh, norms 4sbh: 34sbh + 5as^2b
(paper Eq. 1). Under tensor parallelism without sequence parallelism the norm inputs, the two block
inputs and the dropout masks (10sbh for GPT) are replicated on every rank and the rest is split by t
(paper Eq. 2: sbh(10 + 24/t + 5as/(ht))); with sequence parallelism everything is split (Eq. 4:
sbh(34/t + 5as/(ht))). Selective recomputation drops the attention-core terms (Eq. 6: 34sbh/t with SP);
full recomputation keeps only the layer input, 2sbh (/t with SP).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property

from wavefront.shapes import ModelDims
from wavefront.workbench import kpi
from wavefront.workbench.planner.moe import MLA, MoE

#: Activation checkpointing policies: none; selective (Korthikanti: the attention core is recomputed);
#: op (per-op selective as torchtitan/PyTorch SAC do it: matmul and attention outputs are saved, the
#: elementwise ops between them are recomputed); every-other (full recomputation of every second layer,
#: torchtitan's "full" with a frequency of 2); full (every layer keeps only its input).
RECOMPUTE_MODES = ("none", "selective", "op", "every-other", "full")
KERNELS = ("fused", "eager")


@dataclass(frozen=True)
class ModelSpec:
    """A model plus the implementation choices that change its memory and time.

    attention: "flash" (no s^2 tensor is stored or streamed; the default for current training stacks)
    or "materialized" (Megatron-LM 2021: scores and softmax written to memory, as in the papers' tables).
    dropout: whether the layer keeps dropout masks (GPT-3 era models: yes; Llama-family training: no).
    kernels: "fused" (norms and gated activations as fused kernels: Megatron, wavefront-patched models) or
    "eager" (Hugging Face's eager modules, which keep more activations; module docstring).
    moe: the expert layout of a mixture-of-experts model (moe.py); None for a dense model.
    mla: multi-head latent attention dimensions (DeepSeek-V3; moe.py); None for standard attention.
    """

    dims: ModelDims
    attention: str = "flash"
    dropout: bool = False
    kernels: str = "fused"
    moe: MoE | None = None
    mla: MLA | None = None

    def __post_init__(self) -> None:
        if self.attention not in ("flash", "materialized"):
            raise ValueError(f"attention must be 'flash' or 'materialized', got {self.attention!r}")
        if self.kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {KERNELS}, got {self.kernels!r}")

    @property
    def name(self) -> str:
        return self.dims.name

    @property
    def q_dim(self) -> int:
        """Query width (MLA: heads x (nope + rope) head dim)."""
        if self.mla is not None:
            return self.dims.n_heads * self.mla.qk_head
        return self.dims.n_heads * self.dims.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): 2 x kv_dim is what K and V hold together (MLA: their mean width)."""
        if self.mla is not None:
            return self.dims.n_heads * (self.mla.qk_head + self.mla.v_head) // 2
        return self.dims.n_kv_heads * self.dims.head_dim

    @property
    def attn_core_width(self) -> int:
        """H x (qk head dim + v head dim) / 2: QK^T and attention x V take 4 x this FLOPs per query-key pair."""
        if self.mla is not None:
            return self.dims.n_heads * (self.mla.qk_head + self.mla.v_head) // 2
        return self.q_dim

    @property
    def mla_up_proj_positions(self) -> tuple[int, ...]:
        """Where the MLA up-projections sit in attn_linear_shapes (q_b, or the whole query projection
        without a query bottleneck, and kv_b): what Megatron-Core's "mla_up_proj" recompute module reruns;
        () without MLA."""
        if self.mla is None:
            return ()
        return (1, 3) if self.mla.q_lora_rank else (0, 2)

    def attn_linear_shapes(self, tp: int) -> list[tuple[int, int]]:
        """(d_in, d_out) of the attention block's weight matmuls on one tensor-parallel rank. MLA's two
        down-projections are replicated across tp (Megatron-Core keeps them whole); the rest are split."""
        h = self.dims.hidden
        if self.mla is None:
            return [(h, (self.q_dim + 2 * self.kv_dim) // tp), (self.q_dim // tp, h)]
        q_a, q_b, kv_a, kv_b, o = self.mla.linear_shapes(h, self.dims.n_heads)
        shapes = [q_a, (q_b[0], q_b[1] // tp), kv_a, (kv_b[0], kv_b[1] // tp), (o[0] // tp, o[1])]
        return [(i, o) for i, o in shapes if i and o]

    @cached_property
    def attn_params(self) -> int:
        return sum(i * o for i, o in self.attn_linear_shapes(1))

    @cached_property
    def layer_matmul_params(self) -> int:
        """Weights of one dense layer's matmuls: QKV + output projection and the MLP (no biases)."""
        h = self.dims.hidden
        mlp = (3 if self.dims.gated_mlp else 2) * h * self.dims.ffn_hidden
        return self.attn_params + mlp

    @cached_property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.dims.hidden

    @property
    def n_moe_layers(self) -> int:
        return 0 if self.moe is None else self.dims.n_layers - self.moe.first_dense

    @cached_property
    def expert_params(self) -> int:
        """Weights of one routed expert (a gated MLP of width expert_ffn)."""
        return 0 if self.moe is None else self.moe.experts_params(self.dims.hidden, 1)

    @cached_property
    def moe_layer_dense_params(self) -> int:
        """Weights of one MoE layer outside the routed experts: attention, router, shared experts, norms."""
        if self.moe is None:
            return 0
        h = self.dims.hidden
        return self.attn_params + h * self.moe.n_experts + self.moe.experts_params(h, self.moe.n_shared) + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.dims.vocab * self.dims.hidden

    @cached_property
    def total_params(self) -> int:
        if self.moe is None and self.mla is None:
            return kpi.param_count(self.dims).total
        return self._params(active=False)

    @cached_property
    def active_params(self) -> int:
        """Parameters one token computes with (MoE: top_k routed + shared experts; dense: all)."""
        if self.moe is None and self.mla is None:
            return kpi.param_count(self.dims).total
        return self._params(active=True)

    def _params(self, *, active: bool) -> int:
        dims, h = self.dims, self.dims.hidden
        head = 0 if dims.tied_embeddings else self.embedding_params
        n_dense = dims.n_layers - self.n_moe_layers
        routed = 0
        if self.moe is not None:
            routed = self.moe.experts_params(h, self.moe.top_k if active else self.moe.n_experts)
        return (n_dense * self.layer_params + self.n_moe_layers * (self.moe_layer_dense_params + routed)
                + self.embedding_params + head + h)

    def model_flops_per_token(self, seq_len: int) -> float:
        """PaLM-convention model FLOPs per token (the MFU numerator), from the shared KPI module; MoE
        models count active parameters only (moe.py)."""
        if self.moe is None and self.mla is None:
            return _model_flops(self.dims, seq_len)
        return 6.0 * self._matmul_active() + 12.0 * self.dims.n_layers * self.attn_core_width * seq_len

    def hardware_flops_per_token(self, seq_len: int, recompute: str,
                                 modules: tuple[str, ...] = ("core_attn",)) -> float:
        """Model FLOPs plus recomputation (the HFU numerator), from the shared KPI module; recompute=
        "selective" reruns `modules` (Training.recompute_modules): the attention core, the MLA
        up-projections (2 FLOPs per weight per token), the dense layers' MLPs; the experts' activation
        function has no matmul FLOPs."""
        attn_fwd = 4.0 * self.dims.n_layers * self.attn_core_width * seq_len
        if recompute == "selective" and tuple(modules) != ("core_attn",):
            extra = attn_fwd if "core_attn" in modules else 0.0
            if "mla_up_proj" in modules:
                shapes = self.attn_linear_shapes(1)
                extra += 2.0 * self.dims.n_layers * sum(shapes[i][0] * shapes[i][1] for i in self.mla_up_proj_positions)
            if "mlp" in modules:
                mlp = (3 if self.dims.gated_mlp else 2) * self.dims.hidden * self.dims.ffn_hidden
                extra += 2.0 * (self.dims.n_layers - self.n_moe_layers) * mlp
            return self.model_flops_per_token(seq_len) + extra
        if self.moe is None and self.mla is None:
            return _hardware_flops(self.dims, seq_len, recompute)
        full = 2.0 * self._matmul_active() + attn_fwd
        extra = {"none": 0.0, "op": 0.0, "selective": attn_fwd, "full": full, "every-other": 0.5 * full}[recompute]
        return self.model_flops_per_token(seq_len) + extra

    def _matmul_active(self) -> int:
        """Active parameters that take part in matmuls (kpi.ParamCount.matmul's rule: an untied input
        embedding is a lookup)."""
        return self.active_params - (0 if self.dims.tied_embeddings else self.embedding_params)


@cache
def _model_flops(dims: ModelDims, seq_len: int) -> float:
    return kpi.flops_per_token(dims, seq_len)


@cache
def _hardware_flops(dims: ModelDims, seq_len: int, recompute: str) -> float:
    if recompute == "op":  # recomputes elementwise ops only: no matmul FLOPs
        return kpi.hardware_flops_per_token(dims, seq_len, recompute="none")
    if recompute == "every-other":
        return 0.5 * (kpi.hardware_flops_per_token(dims, seq_len, recompute="none")
                      + kpi.hardware_flops_per_token(dims, seq_len, recompute="full"))
    return kpi.hardware_flops_per_token(dims, seq_len, recompute=recompute)


def attention_core_flops(model: ModelSpec, micro_batch: int, q_len: float, kv_len: float) -> float:
    """Forward FLOPs of QK^T and attention x V for one layer: 2 matmuls x 2 FLOP per MAC."""
    return 4.0 * micro_batch * q_len * kv_len * model.attn_core_width


def layer_matmul_flops(model: ModelSpec, tokens: float) -> float:
    """Forward FLOPs of one layer's weight matmuls for `tokens` tokens (2 per MAC per weight)."""
    return 2.0 * tokens * model.layer_matmul_params


def layer_matmuls(model: ModelSpec) -> list[tuple[str, int, int]]:
    """(name, d_in, d_out) of one dense layer's weight matmuls in the order a forward runs them, unsplit:
    Llama-style blocks run q, k and v as three projections (torchtitan, Hugging Face), then the output
    projection, then the MLP's gate, up and down (plain MLP: fc1, fc2). MLA: its five projections."""
    h, f = model.dims.hidden, model.dims.ffn_hidden
    if model.mla is not None:
        attn = [(f"mla{i}", i_, o) for i, (i_, o) in enumerate(model.attn_linear_shapes(1))]
    else:
        attn = [("q", h, model.q_dim), ("k", h, model.kv_dim), ("v", h, model.kv_dim), ("o", model.q_dim, h)]
    mlp = [("gate", h, f), ("up", h, f), ("down", f, h)] if model.dims.gated_mlp else [("fc1", h, f), ("fc2", f, h)]
    return attn + mlp


def op_recomputed_matmuls(n: int, fraction: float) -> list[bool]:
    """Which of a layer's n matmuls (in order) a per-op policy that recomputes `fraction` of them by count
    reruns: the k-th (from 1) when floor(k f) > floor((k - 1) f). f = 0.5 is torchtitan's policy (its
    counter recomputes every second mm of a block: the 2nd, 4th, 6th), 0 saves every output, 1 none."""
    return [int(k * fraction + 1e-9) > int((k - 1) * fraction + 1e-9) for k in range(1, n + 1)]


def op_policy_fractions(model: ModelSpec, fraction: float, *, tp: int = 1, sp: bool = True) -> tuple[float, float]:
    """(share of the layer's matmul forward FLOPs recomputed, share of its matmul output bytes kept) under
    a per-op policy recomputing `fraction` of the matmuls by count (op_recomputed_matmuls), over
    layer_matmuls: Llama 3 8B at 0.5 (k, o, up recomputed) reruns 37% of the FLOPs and keeps 55% of the
    bytes. Outputs split as the activation list splits them (o and down: by tp only with sequence
    parallelism)."""
    mms = layer_matmuls(model)
    if fraction <= 0.0:
        return 0.0, 1.0
    again = op_recomputed_matmuls(len(mms), fraction)
    flops = [i * o for _, i, o in mms]
    out = [o / (tp if (sp or name not in ("o", "down", "fc2")) else 1) for name, _, o in mms]
    recomputed = sum(x for x, r in zip(flops, again, strict=True) if r) / sum(flops)
    kept = sum(x for x, r in zip(out, again, strict=True) if not r) / sum(out)
    return recomputed, kept


def layer_activation_bytes(model: ModelSpec, *, seq_len: float, micro_batch: int, tp: int, sp: bool,
                           recompute: str, kv_len: float | None = None, fp8: bool = False,
                           routed_rows: float = 0.0, op_saved_mm: float = 1.0,
                           modules: tuple[str, ...] = ("core_attn",)) -> float:
    """Activation bytes one layer keeps for backward, per GPU, for one micro-batch (module docstring).

    seq_len is the local sequence (s / cp under context parallelism); kv_len the keys each query sees
    (the full sequence; defaults to seq_len). Materialised attention under CP keeps s/cp x s scores.
    fp8: the linear layers run in fp8 and keep their inputs as the 1-byte fp8 copy the weight-gradient
    GEMM reads (Transformer Engine, torchao float8): the QKV and MLP inputs (sbh each), the attention
    output (sb q_dim) and the down projection's input (sbf) at 1 byte instead of 2.
    routed_rows > 0: a MoE layer whose busiest EP rank runs that many token copies through its experts.
    Its MLP terms become the shared experts' (width n_shared x expert_ffn, split by tp) plus, per routed
    row, the grouped GEMMs' inputs and outputs as a gated MLP keeps them (lin*h permuted input, 4 f_e gate
    and up outputs, lin*f_e down-projection input) and the 2h expert output the weighted combine needs in
    backward (all on this rank, not split by tp: expert tensor parallel 1), plus the fp32 router scores
    (4 B x E per local token). Per-op checkpointing keeps the permuted input and both GEMM outputs.
    op_saved_mm: under recompute="op", the fraction of the weight matmuls' output bytes kept (1: all, what
    `wavefront train`'s policy keeps; torchtitan's, which recomputes every second mm, keeps
    op_policy_fractions(model, Training.op_recompute_mm)[1]: 0.55 for Llama 3 8B); the layer input,
    attention output and its LSE are kept either way.
    modules: what recompute="selective" reruns (Training.recompute_modules): "core_attn" drops materialised
    attention scores, "mla_up_proj" the MLA queries, keys and values (2 B x (q_dim + 2 kv_dim) per token;
    its latents stay as the up-projections' inputs), "mlp" a dense layer's MLP terms (its input stays),
    "moe_act" the experts' activation output (the down projection's input, per routed row).
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    s, b, h = float(seq_len), float(micro_batch), float(model.dims.hidden)
    kv_len = s if kv_len is None else float(kv_len)
    sbh = s * b * h
    sp_div = tp if sp else 1
    if recompute == "full":
        return 2.0 * sbh / sp_div
    if recompute == "every-other":
        none = layer_activation_bytes(model, seq_len=seq_len, micro_batch=micro_batch, tp=tp, sp=sp,
                                      recompute="none", kv_len=kv_len, fp8=fp8, routed_rows=routed_rows)
        return 0.5 * (none + 2.0 * sbh / sp_div)
    f = float(model.dims.ffn_hidden)
    a = float(model.dims.n_heads)
    moe_rows = 0.0
    if routed_rows > 0 and model.moe is not None:
        f = float(model.moe.shared_ffn)
        fe, h = float(model.moe.expert_ffn), float(model.dims.hidden)
        router = 4.0 * s * b / sp_div * model.moe.n_experts
        per_row = (2.0 * h + 4.0 * fe + 2.0 * h) if recompute == "op" else (
            (1.0 if fp8 else 2.0) * (h + fe) + 4.0 * fe + 2.0 * h)
        if recompute == "selective" and "moe_act" in modules:
            per_row -= (1.0 if fp8 else 2.0) * fe
        moe_rows = routed_rows * per_row + router
    if recompute == "op":
        # saved: the layer input, QKV, attention output (+ LSE), output projection, the MLP's first
        # matmul(s) and its output; the norms, RoPE, activation and residual adds are recomputed
        up = (2.0 if model.dims.gated_mlp else 1.0) * s * b * f
        kept = 2.0 * sbh / sp_div + (2.0 * s * b * model.q_dim + 4.0 * a * s * b) / tp
        mm_out = 4.0 * sbh / sp_div + (2.0 * s * b * (model.q_dim + 2 * model.kv_dim) + 2.0 * up) / tp
        return kept + op_saved_mm * mm_out + moe_rows
    lin = 1.0 if fp8 else 2.0
    masks = 2.0 * sbh if model.dropout else 0.0
    eager = model.kernels == "eager"
    replicated = (12.0 if eager else 4.0) * sbh + lin * sbh + lin * sbh + masks
    mlp = ((6.0 + lin if eager else 4.0 + lin) if model.dims.gated_mlp else 2.0 + lin) * s * b * f
    selective = set(modules) if recompute == "selective" else set()
    if "mlp" in selective and routed_rows <= 0:
        mlp = 0.0
    qkv = 2.0 * s * b * model.q_dim + 4.0 * s * b * model.kv_dim
    if "mla_up_proj" in selective and model.mla is not None:
        qkv = 0.0
    split = lin * s * b * model.q_dim + qkv + mlp
    if model.attention == "flash":
        split += 4.0 * a * s * b
    elif "core_attn" not in selective:
        split += (5.0 if model.dropout else 2.0) * a * s * kv_len * b
    return replicated / sp_div + split / tp + moe_rows


def embedding_activation_bytes(model: ModelSpec, *, seq_len: float, micro_batch: int, tp: int, sp: bool) -> float:
    """First pipeline stage: the embedding dropout mask sbh (if dropout; /t with SP) and the int64 token
    ids 8sb (Korthikanti et al. Sec. 4.2.2; Megatron ``theoretical_memory_usage``)."""
    s, b, h = float(seq_len), float(micro_batch), float(model.dims.hidden)
    mask = s * b * h / (tp if sp else 1) if model.dropout else 0.0
    return mask + 8.0 * s * b


def output_activation_bytes(model: ModelSpec, *, seq_len: float, micro_batch: int, tp: int) -> float:
    """Last pipeline stage: inputs of the output layer and the float32 logits of the cross-entropy,
    4sbh(1 + V/h) / t (Korthikanti et al. Sec. 4.2.2, Megatron: "Inputs to output layer and CE loss")."""
    s, b, h = float(seq_len), float(micro_batch), float(model.dims.hidden)
    return 4.0 * s * b * h * (1.0 + model.dims.vocab / h) / tp
