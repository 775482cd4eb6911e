"""Dimensions of real models: the source of every benchmark shape and planner preset.

Values are the Hugging Face ``config.json`` fields of each model (hidden_size, intermediate_size,
num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size) and, for GPT-3, Brown
et al. 2020 Table 2.1. Benchmark cases read these instead of inventing sizes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    name: str
    hidden: int
    ffn_hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    seq_len: int  # training context the model was trained at (or its default config)
    gated_mlp: bool = True  # SwiGLU/GeGLU (three matrices) vs a plain two-matrix MLP
    tied_embeddings: bool = False
    source: str = ""


MODELS: dict[str, ModelDims] = {
    m.name: m
    for m in (
        ModelDims("llama3-8b", 4096, 14336, 32, 32, 8, 128, 128256, 8192,
                  source="meta-llama/Meta-Llama-3-8B config.json"),
        ModelDims("llama3-70b", 8192, 28672, 80, 64, 8, 128, 128256, 8192,
                  source="meta-llama/Meta-Llama-3-70B config.json"),
        ModelDims("llama3-405b", 16384, 53248, 126, 128, 8, 128, 128256, 8192,
                  source="meta-llama/Llama-3.1-405B config.json"),
        ModelDims("qwen2.5-7b", 3584, 18944, 28, 28, 4, 128, 152064, 4096,
                  source="Qwen/Qwen2.5-7B config.json"),
        ModelDims("qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, 4096,
                  source="Qwen/Qwen3-8B config.json"),
        ModelDims("gemma2-9b", 3584, 14336, 42, 16, 8, 256, 256000, 8192,
                  source="google/gemma-2-9b config.json"),
        ModelDims("mistral-7b", 4096, 14336, 32, 32, 8, 128, 32768, 8192,
                  source="mistralai/Mistral-7B-v0.3 config.json"),
        ModelDims("gpt3-175b", 12288, 49152, 96, 96, 96, 128, 50257, 2048, gated_mlp=False,
                  tied_embeddings=True, source="Brown et al. 2020, Table 2.1"),
    )
}

# GPT models of Narayanan et al. 2021 (arXiv:2104.04473), Table 1 (weak scaling on A100s) and Table 2: GPT-2/3
# style (LayerNorm, GeLU MLP with f = 4h, learned positions, tied embeddings), vocabulary 51,200 (padded),
# sequence 2048; the Table 2 175B model is GPT-3 175B with that vocabulary (174.6B parameters). The planner's
# validation tables (tests/data/published) refer to these names.
_NARAYANAN_T1 = "Narayanan et al. 2021, arXiv:2104.04473, Table 1"
MODELS.update({
    m.name: m
    for m in (
        ModelDims(f"megatron-gpt-{size}", h, 4 * h, layers, heads, heads, h // heads, 51200, 2048, gated_mlp=False,
                  tied_embeddings=True, source=_NARAYANAN_T1)
        for size, heads, h, layers in (
            ("1.7b", 24, 2304, 24), ("3.6b", 32, 3072, 30), ("7.5b", 32, 4096, 36), ("18.4b", 48, 6144, 40),
            ("39.1b", 64, 8192, 48), ("76.1b", 80, 10240, 60), ("145.6b", 96, 12288, 80),
            ("310.1b", 128, 16384, 96), ("529.6b", 128, 20480, 105), ("1t", 160, 25600, 128),
        )
    )
})
MODELS["megatron-gpt-22b"] = ModelDims("megatron-gpt-22b", 6144, 24576, 48, 64, 64, 96, 51200, 2048, gated_mlp=False,
                                       tied_embeddings=True,
                                       source="Korthikanti et al. 2022, arXiv:2205.05198, Table 3")
MODELS["megatron-gpt-175b"] = ModelDims("megatron-gpt-175b", 12288, 49152, 96, 96, 96, 128, 51200, 2048,
                                        gated_mlp=False, tied_embeddings=True,
                                        source="Narayanan et al. 2021, Table 2 (GPT-3 175B, vocabulary 51,200)")

#: Gemma 3's vocabulary, the widest row the loss kernels must handle (google/gemma-3 tokenizer).
WIDEST_VOCAB = 262_144


def get_model(name: str) -> ModelDims:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def bench_rows(n_cols: int, target_elems: int = 1 << 27, lo: int = 1024, hi: int = 32768) -> int:
    """Rows for a row-wise benchmark: enough that the tensor (~256 MB in bf16) is far larger than L2."""
    return max(lo, min(hi, target_elems // n_cols))
