"""The planner's activation-memory formulas against what autograd really keeps for backward, measured on
this machine (workbench.bench.memory_measure), and the model-state formulas against the ZeRO paper's published example.

Two layers are measured:
- a GPT layer written the way Megatron-LM computes it (LayerNorm, one QKV projection, materialised
  softmax, dropout with 1-byte masks as the fused GPU kernels keep them, GELU MLP): Korthikanti et al.
  2022 Eq. 1, 34sbh + 5as^2b;
- a Hugging Face Llama decoder layer (GQA, SwiGLU, RMSNorm, RoPE), patched with wavefront (fused norms,
  SwiGLU, RoPE and flash attention: the implementation the planner's "flash" formula describes), and
  unpatched (eager), whose extra saved tensors the planner's kernels="eager" terms describe.
The per-layer figure of a Hugging Face model is the difference between a 2-layer and a 1-layer model
built from the same config (the embedding and head are identical in both).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from wavefront.shapes import ModelDims
from wavefront.workbench.bench.memory_measure import saved_activation_bytes
from wavefront.workbench.planner import PlanConfig, Training
from wavefront.workbench.planner.memory import state_bytes
from wavefront.workbench.planner.model import ModelSpec, layer_activation_bytes


def _dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    # native_dropout keeps a bool mask on every device, as the fused CUDA/HIP dropout does; CPU's
    # F.dropout is composite and keeps a mask in the input's dtype (2 bytes for bf16).
    return torch.native_dropout(x, p, True)[0]


class _GPTLayer(nn.Module):
    """Pre-LN GPT layer in Megatron's [s, b, h] layout. recompute: "none"; "selective" (Korthikanti et al.
    2022 Sec. 5: the attention core, QK^T, softmax, dropout and attention x V, runs under checkpointing);
    "full" (the whole layer under checkpointing, only its input kept). Reentrant checkpointing saves its
    inputs through save_for_backward, so the measurement sees them (the non-reentrant kind keeps them in a
    closure, which saved_tensors_hooks cannot see)."""

    def __init__(self, hidden: int, heads: int, p: float = 0.1, recompute: str = "none") -> None:
        super().__init__()
        self.heads, self.p, self.recompute = heads, p, recompute
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s, b, _, d = q.shape
        scores = torch.matmul(q.permute(1, 2, 0, 3), k.permute(1, 2, 3, 0)) * (1.0 / math.sqrt(d))
        probs = _dropout(torch.softmax(scores, dim=-1), self.p)
        return torch.matmul(probs, v.permute(1, 2, 0, 3)).permute(2, 0, 1, 3).reshape(s, b, -1)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(s, b, self.heads, 3 * d).split(d, dim=-1)
        if self.recompute == "selective":
            ctx = checkpoint(self._core, q, k, v, use_reentrant=True)
        else:
            ctx = self._core(q, k, v)
        x = x + _dropout(self.proj(ctx), self.p)
        return x + _dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._layer, x, use_reentrant=True) if self.recompute == "full" else self._layer(x)


def test_measure_counts_each_storage_once_and_skips_parameters():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)

    def fn():
        y = x @ w  # saves x and w
        return (y * y).sum() + (y[:2] * 3).sum()  # y saved once (two saves of one storage)

    got = saved_activation_bytes(fn, exclude=[w])
    assert got.total_bytes == x.numel() * 4 + 4 * 8 * 4
    assert {t.shape for t in got.tensors} == {(4, 8)}
    with pytest.raises(TypeError, match="fn must be a callable"):
        saved_activation_bytes(3)


@pytest.mark.parametrize(("recompute", "paper"), [("none", "Eq. 1: 34sbh + 5as^2b"), ("selective", "Eq. 6: 34sbh"),
                                                ("full", "Sec. 5: 2sbh, the layer input")])
def test_gpt_layer_measured_matches_korthikanti_per_recompute_policy(recompute, paper):
    s, b, h, a = 128, 2, 256, 4
    torch.manual_seed(0)
    layer = _GPTLayer(h, a, recompute=recompute).to(torch.bfloat16)
    x = torch.randn(s, b, h, dtype=torch.bfloat16, requires_grad=True)
    measured = saved_activation_bytes(lambda: layer(x), exclude=layer.parameters()).total_bytes
    model = ModelSpec(ModelDims("gpt-test", h, 4 * h, 1, a, a, h // a, 1000, s, gated_mlp=False),
                      attention="materialized", dropout=True)
    predicted = layer_activation_bytes(model, seq_len=s, micro_batch=b, tp=1, sp=False, recompute=recompute)
    expected = {"none": 34 * s * b * h + 5 * a * s * s * b, "selective": 34 * s * b * h, "full": 2 * s * b * h}
    assert predicted == expected[recompute]
    err = measured / predicted - 1
    print(f"\nGPT layer, recompute {recompute} ({paper}): measured {measured} B, formula {predicted:.0f} B, {err:+.2%}")
    if recompute == "full":
        assert measured == predicted  # exactly the checkpointed input
    else:  # the only tensors outside the formula: the two LayerNorms' per-row mean and rstd (bf16 on CPU)
        assert measured - predicted == 2 * 2 * 2 * s * b


#: (seq, batch, hidden, ffn, heads, kv_heads): the default suite's shape keeps the Triton interpreter's
#: work small (the patched run interprets every kernel); the formula's terms are all linear in s, b, h, f
#: except none, so a small layer tests them as well as a large one. LARGE is the earlier, slow shape.
SMALL = (16, 1, 64, 96, 2, 1)
LARGE = (64, 2, 128, 352, 4, 2)


def _hf_layer_bytes(patch: bool, shape: tuple[int, ...] = SMALL) -> tuple[int, ModelSpec, int, int]:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    import wavefront

    s, b, h, f, a, kv = shape
    per_model = []
    for n_layers in (1, 2):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=512, hidden_size=h, intermediate_size=f, num_hidden_layers=n_layers,
                          num_attention_heads=a, num_key_value_heads=kv, max_position_embeddings=s,
                          attn_implementation="sdpa")
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        if patch:
            wavefront.patch(model, attention=True, loss=False)
        ids = torch.randint(0, 512, (b, s), generator=torch.Generator().manual_seed(1))
        per_model.append(saved_activation_bytes(lambda: model(input_ids=ids).logits,  # noqa: B023
                                                exclude=model.parameters()).total_bytes)
    spec = ModelSpec(ModelDims("llama-test", h, f, 1, a, kv, h // a, 512, s))
    return per_model[1] - per_model[0], spec, s, b


@pytest.mark.parametrize("shape", [SMALL, pytest.param(LARGE, marks=pytest.mark.slow)], ids=["small", "large"])
def test_wavefront_patched_llama_layer_matches_the_flash_formula(shape):
    measured, spec, s, b = _hf_layer_bytes(patch=True, shape=shape)
    predicted = layer_activation_bytes(spec, seq_len=s, micro_batch=b, tp=1, sp=False, recompute="none")
    err = measured / predicted - 1
    print(f"\nwavefront-patched Llama layer: measured {measured} B, formula {predicted:.0f} B, {err:+.2%}")
    # outside the formula: the two norms' float32 rstd per row (8 bytes per token)
    assert measured - predicted == 8 * s * b


def test_eager_hugging_face_llama_layer_matches_the_eager_formula():
    """Finding: eager HF keeps float32 norm intermediates and the SiLU input/output separately, so the
    fused-kernel formula under-predicts an unpatched model's activations by about 40%; the planner's
    kernels="eager" terms (model.py docstring) account for them."""
    measured, spec, s, b = _hf_layer_bytes(patch=False)
    fused = layer_activation_bytes(spec, seq_len=s, micro_batch=b, tp=1, sp=False, recompute="none")
    eager_spec = ModelSpec(spec.dims, kernels="eager")
    eager = layer_activation_bytes(eager_spec, seq_len=s, micro_batch=b, tp=1, sp=False, recompute="none")
    print(f"\neager Llama layer: measured {measured} B, fused formula {fused:.0f} B ({measured / fused - 1:+.2%}), "
          f"eager formula {eager:.0f} B ({measured / eager - 1:+.2%})")
    assert 0.25 <= measured / fused - 1 <= 0.6
    # outside the eager formula, as for the fused one: the norms' float32 rstd per row
    assert measured - eager == 8 * s * b


# Rajbhandari et al. 2020 (ZeRO, arXiv:1910.02054), Figure 1: model states per device for psi = 7.5B
# parameters, K = 12 (mixed-precision Adam: fp32 master, momentum, variance), Nd = 64, fp16 weights and
# gradients: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB (GB = 1e9 bytes).
@pytest.mark.parametrize(("zero", "published_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure1_model_states(zero, published_gb):
    training = Training(global_batch_tokens=2048, seq_len=1024, grad_bytes=2, zero3_16bit_shard=True)
    total = sum(state_bytes(7.5e9, PlanConfig(dp=64, zero=zero), training)) / 1e9
    assert abs(total - published_gb) <= 0.05  # the figure rounds to 0.1 GB
    if zero == 3:  # FSDP2's layout (fp32 shard as the master, no 16-bit shard) keeps 2 bytes/param less
        fsdp2 = Training(global_batch_tokens=2048, seq_len=1024, grad_bytes=2)
        assert sum(state_bytes(7.5e9, PlanConfig(dp=64, zero=3), fsdp2)) == pytest.approx(7.5e9 * 14 / 64)
