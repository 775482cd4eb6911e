"""patch(model, fp8=...): which Linear layers become Float8Linear, the recipe options that keep layers in
high precision, the report, unpatch, the checkpoint layout, and training.

Training, two criteria:

- kernels = torch path: the FP8 kernels under the interpreter train a one-layer model exactly like the
  PyTorch emulation of the same recipe (reference.linear_fp8: the same quantization, dequantized to fp32
  and multiplied by PyTorch), to within twice the spread that a one-ulp change of the initial weights
  causes plus 4 ulps of the loss (the project's convergence rule, wavefront.workbench.distributed.train.
  convergence). Default suite, 2 steps.
- FP8 vs bf16 (slow, 100 steps, torch path, Llama and Qwen3, rowwise and blockwise): from the same
  initial weights the FP8 run's loss stays within twice the seed-to-seed spread of bf16 training (the
  largest distance of bf16 runs from two other initializations to the bf16 run, running maximum over
  steps): FP8 may change the trajectory no more than a different random initialization does, the
  criterion FP8 training reports use ("within run-to-run variation").
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import wavefront
from wavefront.nn import Float8Linear
from wavefront.patching import OPS, Fp8Config, PatchError
from wavefront.workbench.distributed.train.convergence import train_losses

FP8_ONLY = dict.fromkeys(OPS, False)  # every other op off: the FP8 swap alone
PER_LAYER = 7  # q, k, v, o, gate, up, down


def _linears(model, cls):
    return sorted(path for path, m in model.named_modules() if type(m) is cls)


def test_swaps_every_decoder_linear_and_keeps_the_head(tiny):
    model = tiny("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    originals = dict(model.named_modules())
    report = wavefront.patch(model, fp8="rowwise", **FP8_ONLY)
    n_layers = model.config.num_hidden_layers
    assert report.fp8 == "rowwise" and "fp8" in report.requested and report.ok
    assert report.counts() == {"fp8": PER_LAYER * n_layers}
    assert len(_linears(model, Float8Linear)) == PER_LAYER * n_layers
    assert _linears(model, nn.Linear) == ["lm_head"]
    assert any("lm_head" in a.reason for a in report.absent if a.op == "fp8")
    assert "FP8 recipe 'rowwise'" in str(report) and report.as_dict()["fp8"] == "rowwise"
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    wavefront.unpatch(model)
    assert all(m is originals[p] for p, m in model.named_modules())


def test_composes_with_the_default_patch(tiny):
    model = tiny("qwen3")
    report = wavefront.patch(model, fp8="blockwise")
    assert report.counts()["fp8"] == PER_LAYER * model.config.num_hidden_layers and report.counts()["mlp"] >= 1
    assert all(isinstance(m.mlp.down_proj, Float8Linear) for m in model.model.layers)
    wavefront.unpatch(model)
    assert not _linears(model, Float8Linear)


def test_recipe_options_keep_layers(tiny):
    model = tiny("llama", num_hidden_layers=3)
    report = wavefront.patch(model, fp8=Fp8Config("rowwise", keep_first_last=True, keep_attention=True), **FP8_ONLY)
    assert _linears(model, Float8Linear) == [f"model.layers.1.mlp.{n}" for n in ("down_proj", "gate_proj", "up_proj")]
    kept = next(a.reason for a in report.absent if a.op == "fp8")
    assert "model.layers.0.mlp.up_proj" in kept and "model.layers.1.self_attn.q_proj" in kept
    wavefront.unpatch(model)


def test_moe_router_stays_in_high_precision(tiny):
    model = tiny("llama", num_hidden_layers=1)
    model.model.layers[0].mlp.gate = nn.Linear(model.config.hidden_size, 4, bias=False)  # a router's place
    report = wavefront.patch(model, fp8="blockwise", **FP8_ONLY)
    assert type(model.model.layers[0].mlp.gate) is nn.Linear
    assert "model.layers.0.mlp.gate," in next(a.reason for a in report.absent if a.op == "fp8") + ","
    assert report.counts()["fp8"] == PER_LAYER


def test_fp8_lm_head(tiny):
    model = tiny("llama")
    with pytest.raises(PatchError, match="keep_lm_head=False with the fused loss"):
        wavefront.patch(model, fp8=Fp8Config("tensorwise", keep_lm_head=False))
    assert not _linears(model, Float8Linear), "a failed strict patch leaves the model unpatched"
    wavefront.patch(model, fp8=Fp8Config("tensorwise", keep_lm_head=False), **FP8_ONLY)
    assert isinstance(model.lm_head, Float8Linear)


def test_bad_fp8_values(tiny):
    model = tiny("llama")
    with pytest.raises(ValueError, match="fp8 recipe must be one of"):
        wavefront.patch(model, fp8="delayed")
    with pytest.raises(TypeError, match="'fp8' must be None"):
        wavefront.patch(model, fp8=True)


def test_checkpoint_of_the_patched_model_loads_unpatched(tiny):
    model = tiny("qwen3")
    wavefront.patch(model, fp8="rowwise", **FP8_ONLY)
    plain = tiny("qwen3", seed=1)
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    wavefront.unpatch(model)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, model(ids).logits)


# ---------------------------------------------------------------------------------------------------
# Training (the loop is convergence.train_losses, shared with the patching convergence proof).


def _batches(model, seq_len: int, batch: int):
    from wavefront.workbench.distributed.train.data import Batches, synthetic_corpus

    return Batches(synthetic_corpus(model.config.vocab_size, 4096, seed=0), seq_len, batch)


@pytest.fixture
def torch_path(monkeypatch):
    """Run the ops' PyTorch paths (the interpreter off): FP8 linears run reference.linear_fp8."""
    import warnings

    from wavefront.runtime import ReferenceFallbackWarning

    def enter():
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        warnings.simplefilter("ignore", ReferenceFallbackWarning)

    return enter


def test_fp8_kernels_train_like_the_torch_path(tiny, torch_path, monkeypatch):
    from wavefront.workbench.distributed.train.convergence import _nudge_one_ulp

    base = tiny("llama", num_hidden_layers=1).to(torch.bfloat16)
    batches = _batches(base, 4, 1)  # the interpreter's cost is per row: 4 tokens cost half of 8
    steps = 2
    kernels = copy.deepcopy(base)
    wavefront.patch(kernels, fp8="rowwise", **FP8_ONLY)
    loss_kernels = train_losses(kernels, batches, steps, 1e-2)
    torch_path()
    runs = []
    for seed in (None, 1, 2):
        m = copy.deepcopy(base)
        if seed is not None:
            _nudge_one_ulp(m, seed)
        wavefront.patch(m, fp8="rowwise", **FP8_ONLY)
        runs.append(train_losses(m, batches, steps, 1e-2))
    eps = torch.finfo(torch.bfloat16).eps
    running = 0.0
    for t in range(steps):
        running = max(running, *(abs(r[t] - runs[0][t]) for r in runs[1:]))
        assert abs(loss_kernels[t] - runs[0][t]) <= 2 * running + 4 * eps * abs(runs[0][t]), (t, loss_kernels, runs)
    assert loss_kernels[-1] < loss_kernels[0]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["rowwise", "blockwise"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fp8_trains_like_bf16(tiny, torch_path, family, recipe):
    torch_path()
    steps = 100
    base = tiny(family).to(torch.bfloat16)
    batches = _batches(base, 16, 4)
    bf16 = train_losses(copy.deepcopy(base), batches, steps, 1e-2)
    fp8_model = copy.deepcopy(base)
    wavefront.patch(fp8_model, fp8=recipe, **FP8_ONLY)
    fp8 = train_losses(fp8_model, batches, steps, 1e-2)
    seeds = [train_losses(tiny(family, seed=s).to(torch.bfloat16), batches, steps, 1e-2) for s in (1, 2)]
    running, worst = 0.0, 0.0
    for t in range(steps):
        running = max(running, *(abs(s[t] - bf16[t]) for s in seeds))
        worst = max(worst, abs(fp8[t] - bf16[t]) / running)
        assert abs(fp8[t] - bf16[t]) <= 2 * running, f"step {t}: fp8 {fp8[t]:.4f}, bf16 {bf16[t]:.4f}, {running=:.4f}"
    assert fp8[-1] < fp8[0] - 1.0, "the corpus is learnt in FP8"
    print(f"{family}/{recipe}: final loss bf16 {bf16[-1]:.4f} fp8 {fp8[-1]:.4f}; worst |fp8-bf16| / spread {worst:.2f}")


def test_a_family_without_rules_is_reported_unmatched(tiny):
    model = tiny("llama")
    model.config.model_type = "not-a-family"
    report = wavefront.patch(model, fp8="rowwise", strict=False, **FP8_ONLY)
    assert [u.op for u in report.unmatched] == ["fp8"] and "no rules for model_type 'not-a-family'" in str(report)
    assert not _linears(model, Float8Linear)
