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
    """

    dims: ModelDims
    attention: str = "flash"
    dropout: bool = False
    kernels: str = "fused"

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
        return self.dims.n_heads * self.dims.head_dim

    @property
    def kv_dim(self) -> int:
        return self.dims.n_kv_heads * self.dims.head_dim

    @cached_property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's matmuls: QKV + output projection and the MLP (no biases)."""
        h = self.dims.hidden
        attn = 2 * h * self.q_dim + 2 * h * self.kv_dim
        mlp = (3 if self.dims.gated_mlp else 2) * h * self.dims.ffn_hidden
        return attn + mlp

    @cached_property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.dims.hidden

    @property
    def embedding_params(self) -> int:
        return self.dims.vocab * self.dims.hidden

    @cached_property
    def total_params(self) -> int:
        return kpi.param_count(self.dims).total

    def model_flops_per_token(self, seq_len: int) -> float:
        """PaLM-convention model FLOPs per token (the MFU numerator), from the shared KPI module."""
        return _model_flops(self.dims, seq_len)

    def hardware_flops_per_token(self, seq_len: int, recompute: str) -> float:
        """Model FLOPs plus recomputation (the HFU numerator), from the shared KPI module."""
        return _hardware_flops(self.dims, seq_len, recompute)


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
    return 4.0 * micro_batch * q_len * kv_len * model.q_dim


def layer_matmul_flops(model: ModelSpec, tokens: float) -> float:
    """Forward FLOPs of one layer's weight matmuls for `tokens` tokens (2 per MAC per weight)."""
    return 2.0 * tokens * model.layer_matmul_params


def layer_activation_bytes(model: ModelSpec, *, seq_len: float, micro_batch: int, tp: int, sp: bool,
                           recompute: str, kv_len: float | None = None, fp8: bool = False) -> float:
    """Activation bytes one layer keeps for backward, per GPU, for one micro-batch (module docstring).

    seq_len is the local sequence (s / cp under context parallelism); kv_len the keys each query sees
    (the full sequence; defaults to seq_len). Materialised attention under CP keeps s/cp x s scores.
    fp8: the linear layers run in fp8 and keep their inputs as the 1-byte fp8 copy the weight-gradient
    GEMM reads (Transformer Engine, torchao float8): the QKV and MLP inputs (sbh each), the attention
    output (sb q_dim) and the down projection's input (sbf) at 1 byte instead of 2.
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
                                      recompute="none", kv_len=kv_len, fp8=fp8)
        return 0.5 * (none + 2.0 * sbh / sp_div)
    f = float(model.dims.ffn_hidden)
    a = float(model.dims.n_heads)
    if recompute == "op":
        # saved: the layer input, QKV, attention output (+ LSE), output projection, the MLP's first
        # matmul(s) and its output; the norms, RoPE, activation and residual adds are recomputed
        up = (2.0 if model.dims.gated_mlp else 1.0) * s * b * f
        split = 2.0 * s * b * (2 * model.q_dim + 2 * model.kv_dim) + 4.0 * a * s * b + 2.0 * up
        return 6.0 * sbh / sp_div + split / tp
    lin = 1.0 if fp8 else 2.0
    masks = 2.0 * sbh if model.dropout else 0.0
    eager = model.kernels == "eager"
    replicated = (12.0 if eager else 4.0) * sbh + lin * sbh + lin * sbh + masks
    mlp = ((6.0 + lin if eager else 4.0 + lin) if model.dims.gated_mlp else 2.0 + lin) * s * b * f
    split = (2.0 + lin) * s * b * model.q_dim + 4.0 * s * b * model.kv_dim + mlp
    if model.attention == "flash":
        split += 4.0 * a * s * b
    elif recompute != "selective":
        split += (5.0 if model.dropout else 2.0) * a * s * kv_len * b
    return replicated / sp_div + split / tp


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
