"""Training KPIs as pure functions: parameter counts, FLOPs per token, MFU/HFU, cost and energy.

Shared by the training harness (measured step times) and the cluster planner (predicted ones), so both
speak the same conventions. Sources are in ../shared/facts/training-math.md.

- FLOPs per token, PaLM convention (Chowdhery et al. 2022, arXiv:2204.02311, App. B):
  ``6 * N + 12 * L * H * Q * T`` with N the parameters that take part in matmuls (all parameters minus
  the input-embedding table, which is a lookup; a tied table is kept because it is also the LM head's
  matmul; torchtitan ``get_num_flop_per_token`` makes the same subtraction), L layers, H query heads,
  Q head dim, T sequence length. Attention is counted non-causal and flash-attention recompute is not
  counted, by convention.
- MFU = tokens/s * FLOPs per token / (n_gpus * dense peak). HFU adds recomputation: full activation
  checkpointing re-runs the forward (2N + attention forward per token), giving about 8N instead of 6N.
- $/step = n_gpus * price per GPU-hour * step seconds / 3600.
- Energy: measured from the GPU's energy counter where one exists; otherwise modeled as
  n_gpus * board power * utilization * step seconds, and labelled modeled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from wavefront.shapes import ModelDims


@dataclass(frozen=True)
class ParamCount:
    total: int
    embedding: int  # the input-embedding table
    lm_head: int  # separate output projection (0 when tied)
    per_layer: int

    @property
    def matmul(self) -> int:
        """Parameters that take part in matmuls (the N of 6N): total minus an untied input embedding."""
        return self.total - (self.embedding if self.lm_head else 0)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"matmul": self.matmul}


def param_count(m: ModelDims) -> ParamCount:
    """Parameters of a decoder-only transformer with GQA, gated or plain MLP, RMSNorm/LayerNorm weights.

    Per layer: q and o projections h x (H*Q) each, k and v h x (KV*Q) each, MLP 3*h*f (gated) or 2*h*f,
    two norm weight vectors. Biases are ignored (Llama-family models have none). Plus the embedding V*h,
    an untied LM head V*h and the final norm h.
    """
    h, q = m.hidden, m.head_dim
    attn = 2 * h * m.n_heads * q + 2 * h * m.n_kv_heads * q
    mlp = (3 if m.gated_mlp else 2) * h * m.ffn_hidden
    per_layer = attn + mlp + 2 * h
    embedding = m.vocab * h
    lm_head = 0 if m.tied_embeddings else m.vocab * h
    total = m.n_layers * per_layer + embedding + lm_head + h
    return ParamCount(total, embedding, lm_head, per_layer)


def flops_per_token(m: ModelDims, seq_len: int | None = None, *, n_params: int | None = None) -> float:
    """Model FLOPs per trained token (forward + backward), PaLM convention. n_params overrides the N
    derived from the dims (pass a measured count of a real module)."""
    t = seq_len if seq_len is not None else m.seq_len
    n = n_params if n_params is not None else param_count(m).matmul
    return 6.0 * n + 12.0 * m.n_layers * m.n_heads * m.head_dim * t


def hardware_flops_per_token(m: ModelDims, seq_len: int | None = None, *, recompute: str = "none",
                             n_params: int | None = None) -> float:
    """FLOPs actually executed per token: model FLOPs plus recomputation.

    recompute="full" re-runs each layer's forward (2N + 4*L*H*Q*T); "selective" re-runs only the attention
    core (4*L*H*Q*T, Korthikanti et al. 2022); "none" adds nothing.
    """
    t = seq_len if seq_len is not None else m.seq_len
    n = n_params if n_params is not None else param_count(m).matmul
    attn_fwd = 4.0 * m.n_layers * m.n_heads * m.head_dim * t
    extra = {"none": 0.0, "selective": attn_fwd, "full": 2.0 * n + attn_fwd}
    if recompute not in extra:
        raise ValueError(f"recompute must be one of {sorted(extra)}, got {recompute!r}")
    return flops_per_token(m, t, n_params=n) + extra[recompute]


def utilization(tokens_per_s: float, flops_per_tok: float, n_gpus: int, peak_tflops: float) -> float:
    """Fraction of the dense peak: MFU with model FLOPs per token, HFU with hardware FLOPs per token."""
    if n_gpus < 1 or peak_tflops <= 0:
        raise ValueError("n_gpus must be >= 1 and peak_tflops > 0")
    return tokens_per_s * flops_per_tok / (n_gpus * peak_tflops * 1e12)


def cost_per_step(n_gpus: int, price_per_gpu_hour: float, step_s: float) -> float:
    """Dollars per optimizer step."""
    return n_gpus * price_per_gpu_hour * step_s / 3600.0


def cost_per_million_tokens(n_gpus: int, price_per_gpu_hour: float, step_s: float, tokens_per_step: float) -> float:
    return cost_per_step(n_gpus, price_per_gpu_hour, step_s) / tokens_per_step * 1e6


def modeled_energy_j(n_gpus: int, board_power_w: float, step_s: float, power_fraction: float = 0.75) -> float:
    """GPU energy per step, modeled (no counter): n_gpus * board power * fraction * seconds.

    The 0.75 default sits in the 60-90% of TDP that dense training draws (training-math.md, "Energy
    per step"); label results that use it as modeled.
    """
    if not 0.0 < power_fraction <= 1.0:
        raise ValueError(f"power_fraction must be in (0, 1], got {power_fraction}")
    return n_gpus * board_power_w * power_fraction * step_s


def megatron_gpt_flops_per_iteration(batch: int, seq_len: int, n_layers: int, hidden: int, vocab: int, *,
                                     full_recompute: bool) -> float:
    """FLOPs of one GPT training iteration as Megatron papers count them (matmuls only).

    Narayanan et al. 2021 (arXiv:2104.04473), Eq. 3, with full activation recomputation (the forward runs
    twice, so 4 passes of the 24*B*s*h^2 per-layer matmuls and 4*B*s^2*h attention, plus the logit layer
    forward and backward, 6*B*s*h*V):  ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``. Without recomputation
    (3 passes; Korthikanti et al. 2022, arXiv:2205.05198, Sec. 6):  ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``.
    The tables of those papers report per-GPU TFLOP/s computed with these counts, so reproductions must
    use the same convention. Valid for the GPT shape they assume: f = 4h, multi-head attention.
    """
    b, s, l, h, v = float(batch), float(seq_len), float(n_layers), float(hidden), float(vocab)
    if full_recompute:
        return 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
    return 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h))


def nemo_llama_flops_per_token(m: ModelDims, seq_len: int) -> float:
    """FLOPs per token as NeMo's performance tables count them for Llama-style models (matmuls only).

    NeMo's ``nemo/utils/flops_formulas.py`` (``llama2``/``llama3``, the releases of 2024-2025 whose tables
    report "TFLOPS / GPU"): ``l h^2 (12 + 12 g/a + 18 f/h + 12 s/h + 6 V/(l h))`` per token, g KV heads of a:
    the Q and output projections, K and V, the gated MLP's three matmuls, the attention scores and their
    product with V counted over the whole s x s square (no causal half) and the logit layer, forward and
    backward. Checked against NeMo 24.03's long-sequence table, which prints both TFLOPS / GPU and tokens/s/GPU
    (tests/workbench/planner/test_planner_validation.py). Gated MLPs only (18 f/h is three matmuls).
    """
    if not m.gated_mlp:
        raise ValueError(f"nemo_llama_flops_per_token: model {m.name!r} has no gated MLP; the formula is Llama's")
    l, h, s = float(m.n_layers), float(m.hidden), float(seq_len)
    return l * h * h * (12.0 + 12.0 * m.n_kv_heads / m.n_heads + 18.0 * m.ffn_hidden / h + 12.0 * s / h
                        + 6.0 * m.vocab / (l * h))
