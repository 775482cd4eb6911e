"""Model presets for the training harness and the convergence proof: Hugging Face configs built locally
(nothing is downloaded), by name.

Tiny presets (``tiny-<family>``), one per patched family, are small enough to train under the Triton
interpreter on a CPU: 2 layers, hidden 32, 4 query heads over 2 KV heads, vocabulary 128. They keep
each family's distinguishing features (Gemma's offset norm and GeGLU, Gemma 2's logit softcaps and four
norms per layer, Qwen3's q/k norms, Qwen2's q/k/v biases, Phi-3's fused gate/up and partial rotary, Gemma 3's
q/k norms and softcap, OLMo 2's post-norms, Granite's and Falcon-H1's multipliers, GLM-4's interleaved partial
rotary, SmolLM3's NoPE layers, Llama 4's L2 q/k norms, the VL models' multimodal RoPE). The VL presets build
the image-text-to-text model (``auto``) and train its text tower on text.

``tiny-mixtral`` and ``tiny-qwen3-moe`` are the MoE families (4 experts, top-2), kept out of
``TINY_BY_FAMILY`` so the dense-family test matrices do not grow.

Full-size presets carry the dimensions of the published ``config.json`` files named in their ``source``;
weights are randomly initialized (throughput and memory do not depend on the values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

_TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256,
         "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


@dataclass(frozen=True)
class Preset:
    name: str
    model_type: str  # transformers config.model_type
    config: dict = field(default_factory=dict)
    source: str = ""
    #: "causal_lm" (AutoModelForCausalLM) or "image_text_to_text" (a vision-language model whose text tower has no
    #: causal-LM class of its own, trained here on text only; its config overrides go to ``text_config``).
    auto: str = "causal_lm"

    def build_config(self, **overrides):
        from transformers import AutoConfig  # lazy: optional transformers

        if "text_config" in self.config:
            return AutoConfig.for_model(self.model_type, **{
                **self.config, "text_config": {**self.config["text_config"], **overrides}})
        return AutoConfig.for_model(self.model_type, **{**self.config, **overrides})


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny-llama", "llama", dict(_TINY), "local tiny config"),
        Preset("tiny-mistral", "mistral", dict(_TINY), "local tiny config"),
        Preset("tiny-qwen2", "qwen2", dict(_TINY), "local tiny config (q/k/v biases)"),
        Preset("tiny-qwen3", "qwen3", dict(_TINY), "local tiny config (q/k norms)"),
        Preset("tiny-gemma", "gemma", {**_TINY, "hidden_act": "gelu_pytorch_tanh"},
               "local tiny config (offset norm, GeGLU)"),
        Preset("tiny-gemma2", "gemma2", {**_TINY, "hidden_activation": "gelu_pytorch_tanh",
                                         "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
                                         "sliding_window": 16}, "local tiny config (softcaps)"),
        Preset("tiny-phi3", "phi3", {**_TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": 0.5}},
               "local tiny config (fused gate/up, partial rotary)"),
        Preset("tiny-gemma3", "gemma3_text", {**_TINY, "hidden_activation": "gelu_pytorch_tanh",
                                              "query_pre_attn_scalar": 8, "sliding_window": 16,
                                              "final_logit_softcapping": 30.0},
               "local tiny config (q/k norms, offset norms, sliding and global layers, logit softcap)"),
        Preset("tiny-olmo2", "olmo2", dict(_TINY), "local tiny config (post-norms, full-width q/k norms)"),
        Preset("tiny-granite", "granite", {**_TINY, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                           "attention_multiplier": 0.125, "logits_scaling": 8.0},
               "local tiny config (muP multipliers)"),
        Preset("tiny-glm4", "glm4", {**_TINY, "partial_rotary_factor": 0.5},
               "local tiny config (fused gate/up, post-norms, interleaved partial rotary)"),
        Preset("tiny-smollm3", "smollm3", {**_TINY, "no_rope_layer_interval": 2},
               "local tiny config (a NoPE layer every 2)"),
        Preset("tiny-llama4", "llama4_text", {**_TINY, "intermediate_size_mlp": 64, "moe_layers": [],
                                              "attention_chunk_size": None},
               "local tiny config (dense layers, L2-normed q/k, complex RoPE)"),
        Preset("tiny-falcon-h1", "falcon_h1", {**_TINY, "mlp_multipliers": [0.6, 1.4], "lm_head_multiplier": 0.5,
                                               "key_multiplier": 0.7, "mamba_d_ssm": 32, "mamba_n_heads": 4,
                                               "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_chunk_size": 8,
                                               "mamba_d_conv": 4},
               "local tiny config (Mamba-2 mixer beside attention, muP multipliers)"),
        Preset("tiny-qwen3-vl", "qwen3_vl", {
            "text_config": {**_TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                        "mrope_section": [1, 1, 2], "mrope_interleaved": True}},
            "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                              "out_hidden_size": 32, "patch_size": 2, "temporal_patch_size": 1,
                              "spatial_merge_size": 1, "deepstack_visual_indexes": []}},
               "local tiny config (text tower trained on text; interleaved MRoPE, q/k norms)",
               auto="image_text_to_text"),
        Preset("tiny-qwen2.5-vl", "qwen2_5_vl", {
            "text_config": {**_TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                        "mrope_section": [1, 1, 2]}},
            "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                              "out_hidden_size": 32, "patch_size": 2, "temporal_patch_size": 1,
                              "spatial_merge_size": 1, "window_size": 4, "fullatt_block_indexes": [0]}},
               "local tiny config (text tower trained on text; MRoPE sections, q/k/v biases)",
               auto="image_text_to_text"),
        Preset("tiny-mixtral", "mixtral", {**_TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
               "local tiny config (MoE: 4 experts, top-2)"),
        Preset("tiny-qwen3-moe", "qwen3_moe", {**_TINY, "num_experts": 4, "num_experts_per_tok": 2,
                                               "moe_intermediate_size": 32, "decoder_sparse_step": 1},
               "local tiny config (MoE: 4 experts, top-2, q/k norms)"),
        Preset("llama3.2-1b", "llama", {
            "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
            "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "bos_token_id": 128000, "eos_token_id": 128001}, "meta-llama/Llama-3.2-1B config.json"),
        Preset("llama3.2-3b", "llama", {
            "vocab_size": 128256, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
            "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True,
            "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "bos_token_id": 128000, "eos_token_id": 128001}, "meta-llama/Llama-3.2-3B config.json"),
        Preset("llama3-8b", "llama", {
            "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
            "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "bos_token_id": 128000, "eos_token_id": 128001}, "meta-llama/Meta-Llama-3-8B config.json"),
    )
}

#: Families whose MLPs are mixtures of experts (``wavefront train --ep``; train/expert_parallel.py).
MOE_FAMILIES = ("mixtral", "qwen3_moe")
#: The tiny preset of each patched dense family, keyed by family name (the MoE ones are in TINY_MOE).
TINY_BY_FAMILY: dict[str, str] = {p.model_type: p.name for p in PRESETS.values()
                                  if p.name.startswith("tiny-") and p.model_type not in MOE_FAMILIES}
TINY_MOE: dict[str, str] = {p.model_type: p.name for p in PRESETS.values()
                            if p.name.startswith("tiny-") and p.model_type in MOE_FAMILIES}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)} (or pass a local "
                         f"directory holding a Hugging Face config.json)") from None


def build_config(model: str, **overrides):
    """A transformers config from a preset name or a local directory with ``config.json``."""
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {model!r} has no config.json")
        from transformers import AutoConfig  # lazy: optional transformers

        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        for k, v in overrides.items():
            setattr(config, k, v)
        return config
    return get_preset(model).build_config(**overrides)


def build_model(model: str, *, seed: int = 0, dtype=None, attn_implementation: str = "eager", **overrides):
    """A randomly initialized causal LM (from a preset or a local config). A local directory that holds
    weights (``model.safetensors`` or ``pytorch_model.bin``) loads them instead. Same seed, same weights.
    A model class that does not support the requested attention implementation (Gemma 2 has no sdpa
    path, because sdpa cannot softcap) gets "eager"."""
    import torch  # lazy: torch-free import
    import transformers  # lazy: optional transformers

    config = build_config(model, **overrides)
    auto = PRESETS[model].auto if model in PRESETS else "causal_lm"
    AutoModelForCausalLM = getattr(transformers, {"causal_lm": "AutoModelForCausalLM",  # noqa: N806 (a class)
                                                  "image_text_to_text": "AutoModelForImageTextToText"}[auto])
    path = Path(model)
    has_weights = path.is_dir() and any((path / f).exists() for f in
                                        ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"))
    kwargs = {"dtype": dtype} if dtype is not None else {}
    for impl in dict.fromkeys((attn_implementation, "eager")):
        torch.manual_seed(seed)
        try:
            if has_weights:
                return AutoModelForCausalLM.from_pretrained(str(path), config=config, local_files_only=True,
                                                            attn_implementation=impl, **kwargs)
            return AutoModelForCausalLM.from_config(config, attn_implementation=impl, **kwargs)
        except ValueError:
            if impl == "eager":
                raise
    raise AssertionError("unreachable")
