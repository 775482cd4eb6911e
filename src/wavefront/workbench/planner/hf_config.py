"""A model from a Hugging Face `config.json`: the dimensions the planner needs, nothing downloaded.

Keys read (transformers' PretrainedConfig names): hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, num_key_value_heads (default: the heads), head_dim (default: hidden / heads; Gemma 2
and Qwen 3 set it apart from hidden / heads), vocab_size, max_position_embeddings (capped at 8192 as the
default training sequence), tie_word_embeddings, hidden_act / hidden_activation (gated MLP for the SwiGLU /
GeGLU families: llama, mistral, qwen2, qwen3, gemma, gemma2, phi3, olmo2; a plain MLP for gpt2-style
models that name `n_embd`, which are read too).
"""

from __future__ import annotations

import json
from pathlib import Path

from wavefront.shapes import ModelDims

GATED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
                     "olmo2", "granite", "cohere")
DEFAULT_SEQ_CAP = 8192


def _int(cfg: dict, *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
            return value
    if default is None:
        raise ValueError(f"config.json lacks {' / '.join(keys)}")
    return default


def dims_from_hf_config(path: str | Path) -> ModelDims:
    """ModelDims from a Hugging Face config.json (module docstring); a clear ValueError on bad files."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--model: {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--model: {path} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"--model: {path} must hold a JSON object")
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head", "n_heads")
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=hidden // heads)
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
