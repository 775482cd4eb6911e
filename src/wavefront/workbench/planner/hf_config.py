"""A model from a Hugging Face `config.json`: the dimensions the planner needs, nothing downloaded.

Keys read (transformers' PretrainedConfig names): hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads (default: the heads), head_dim (default: hidden / heads; Gemma 2
and Qwen 3 set it apart from hidden / heads), vocab_size, max_position_embeddings (capped at 8192 as the
default training sequence), tie_word_embeddings, hidden_act / hidden_activation (gated MLP for the SwiGLU /
GeGLU families: llama, mistral, qwen2, qwen3, gemma, gemma2, phi3, olmo2; a plain MLP for gpt2-style
models that name `n_embd`, which are read too).

Mixture-of-experts configs (moe_from_hf_config): the experts from num_local_experts (Mixtral),
num_experts (Qwen2/3-MoE) or n_routed_experts (DeepSeek); num_experts_per_tok; the expert width from
moe_intermediate_size (else intermediate_size, Mixtral's); shared experts from n_shared_experts (DeepSeek)
or shared_expert_intermediate_size / expert width (Qwen2-MoE); first_k_dense_replace; multi-head latent
attention from kv_lora_rank, q_lora_rank (null: an uncompressed query), qk_nope_head_dim,
qk_rope_head_dim, v_head_dim (the head dim becomes nope + rope).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wavefront.shapes import ModelDims
from wavefront.workbench.planner.moe import MLA, MoE

GATED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
                     "olmo2", "granite", "cohere", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
DEFAULT_SEQ_CAP = 8192


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
            return value
    if default is None:
        raise ValueError(f"config.json lacks {' / '.join(keys)}")
    return default


def _load(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--model: {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--model: {path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"--model: {path} must hold a JSON object")
    return cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg


def moe_from_hf_config(path: str | Path) -> tuple[MoE | None, MLA | None]:
    """The expert layout and latent-attention dims of a Hugging Face config.json (module docstring);
    (None, None) for a dense model with standard attention."""
    cfg = _load(Path(path))
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLA(q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=_int(cfg, "kv_lora_rank"),
                  qk_nope=_int(cfg, "qk_nope_head_dim"), qk_rope=_int(cfg, "qk_rope_head_dim"),
                  v_head=_int(cfg, "v_head_dim"))
    n_experts = next((cfg[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)), None)
    if not n_experts or n_experts <= 1:
        return None, mla
    expert_ffn = _int(cfg, "moe_intermediate_size", "intermediate_size")
    n_shared = int(cfg.get("n_shared_experts") or 0)
    if not n_shared and cfg.get("shared_expert_intermediate_size"):
        n_shared = max(1, round(cfg["shared_expert_intermediate_size"] / expert_ffn))
    return MoE(n_experts=int(n_experts), top_k=_int(cfg, "num_experts_per_tok"), expert_ffn=expert_ffn,
               n_shared=n_shared, first_dense=int(cfg.get("first_k_dense_replace") or 0),
               n_group=int(cfg.get("n_group") or 0) if cfg.get("topk_group") else 0,
               topk_group=int(cfg.get("topk_group") or 0) if cfg.get("n_group") else 0), mla


def dims_from_hf_config(path: str | Path) -> ModelDims:
    """ModelDims from a Hugging Face config.json (module docstring); a clear ValueError on bad files."""
    path = Path(path)
    cfg = _load(path)
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head", "n_heads")
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=hidden // heads)
    if cfg.get("kv_lora_rank"):  # multi-head latent attention: the query/key head is nope + rope
        head_dim = _int(cfg, "qk_nope_head_dim") + _int(cfg, "qk_rope_head_dim")
    model_type = str(cfg.get("model_type", ""))
    gated = model_type in GATED_MODEL_TYPES or "intermediate_size" in cfg and model_type not in ("gpt2", "gpt_neox")
    ffn = _int(cfg, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    if heads % kv_heads:
        raise ValueError(f"config.json: num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
                         f"({kv_heads})")
    seq = min(_int(cfg, "max_position_embeddings", "n_positions", default=4096), DEFAULT_SEQ_CAP)
    return ModelDims(str(cfg.get("_name_or_path") or path.parent.name or model_type or "hf-model"), hidden, ffn,
                     _int(cfg, "num_hidden_layers", "n_layer", "n_layers"), heads, kv_heads, head_dim,
                     _int(cfg, "vocab_size"), seq, gated_mlp=gated,
                     tied_embeddings=bool(cfg.get("tie_word_embeddings", model_type == "gpt2")),
                     source=f"Hugging Face config {path}")
