"""patch(fp8=...) with fused producers (Fp8Config.fused_producers, on by default): each FP8 linear input is
quantized once, in the op that produces it (the norms for q/k/v and gate/up, SwiGLU for down_proj and
attention for o_proj under the block recipes), and handed to the Float8Linear layers that read it.

Proof: (1) the loss and every gradient of a patched tiny model are bit-identical with and without the
hand-off; (2) the quantize launches of a forward drop by exactly the fused inputs per layer; (3) the report
lists each hand-off, and why the others are not fused. Safety: a stale copy (the output modified in place,
the producer run again) or a consumer of another recipe never gets it; compiled graphs run without it.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import wavefront
from wavefront.kernels._launch import recording
from wavefront.nn import Float8Linear, RMSNorm
from wavefront.nn.fp8 import HANDOFF_ATTR, Fp8HandOff
from wavefront.patching import Fp8Config

PER_LAYER = 7  # q, k, v, o, gate, up, down: one activation and one weight quantize each in the forward


def _run(model, ids):
    """Loss, gradients and the number of quantize launches in the forward."""
    model.zero_grad(set_to_none=True)
    with recording() as launches:
        out = model(input_ids=ids, labels=ids)
    n_quantize = sum(launch.name.startswith("_quantize") for launch in launches)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, n_quantize


@pytest.mark.parametrize(("family", "recipe", "overrides", "attention", "fused_per_layer"), [
    # rowwise: the norms fuse (q, k, v, gate, up); SwiGLU's and attention's rows span programs
    ("llama", "rowwise", {}, False, 5),
    # blockwise: every input, o_proj from attention's epilogue (head_dim 128 holds whole 1x128 groups)
    pytest.param("qwen3", "blockwise", {"head_dim": 128}, True, 7, marks=pytest.mark.slow),
    # mxfp8: 1x32 groups, E8M0 (power-of-two) scales
    ("llama", "mxfp8", {"head_dim": 32}, True, 7),
])
def test_fused_producers_are_bit_identical_and_quantize_once(tiny, family, recipe, overrides, attention,
                                                             fused_per_layer):
    base = tiny(family, num_hidden_layers=1, **overrides).to(torch.bfloat16)
    ids = torch.randint(0, base.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(0))
    plain, fused = copy.deepcopy(base), base
    report_plain = wavefront.patch(plain, fp8=Fp8Config(recipe, fused_producers=False), attention=attention)
    report = wavefront.patch(fused, fp8=recipe, attention=attention)
    assert not report_plain.handoffs
    loss0, grads0, n0 = _run(plain, ids)
    loss1, grads1, n1 = _run(fused, ids)
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys() and all(torch.equal(grads0[k], grads1[k]) for k in grads0)
    assert n0 == 2 * PER_LAYER, "without the hand-off every linear quantizes its input and its weight"
    assert n0 - n1 == fused_per_layer
    consumers = sorted(c.rpartition(".")[2] for h in report.handoffs for c in h.consumers)
    assert len(consumers) == fused_per_layer
    assert all(h.scaling == {"rowwise": "rowwise", "blockwise": "block1x128", "mxfp8": "block1x32"}[recipe]
               for h in report.handoffs)
    text = str(report)
    assert "fp8 fused  model.layers.0.input_layernorm -> model.layers.0.self_attn.q_proj" in text
    assert report.as_dict()["fp8_handoffs"][0]["producer"] == "model.layers.0.input_layernorm"
    if recipe == "rowwise":
        assert consumers == ["gate_proj", "k_proj", "q_proj", "up_proj", "v_proj"]
        reasons = [a.reason for a in report.absent if a.op == "fp8" and "not fused" in a.reason]
        assert any("mlp.down_proj" in r and "rowwise scales" in r for r in reasons)
        assert any("self_attn.o_proj" in r for r in reasons)
    wavefront.unpatch(fused)
    assert not any(hasattr(m, HANDOFF_ATTR) or hasattr(m, "fp8_source") for m in fused.modules())


def test_reported_reasons_when_a_producer_is_not_patched(tiny):
    model = tiny("llama", num_hidden_layers=1)
    report = wavefront.patch(model, fp8="blockwise", rms_norm=False, mlp=False)  # attention=False by default
    assert not report.handoffs
    reasons = " | ".join(a.reason for a in report.absent if a.op == "fp8")
    assert "rms_norm=False" in reasons and "mlp=False" in reasons and "attention=False" in reasons
    model = tiny("llama", num_hidden_layers=1)
    report = wavefront.patch(model, fp8="blockwise", attention=True)  # the tiny model's head_dim is 8
    assert "head_dim 8 is not a multiple of the block1x128 group" in str(report)
    report = wavefront.patch(tiny("llama", num_hidden_layers=1), fp8="tensorwise")
    assert not report.handoffs and "none under tensorwise" in str(report)


def test_qwen3_layers_are_wired_like_llama(tiny):
    model = tiny("qwen3", head_dim=32)
    report = wavefront.patch(model, fp8="mxfp8", attention=True)
    layers = model.config.num_hidden_layers
    assert [h.producer.rpartition(".")[2] for h in report.handoffs] == [
        "input_layernorm", "self_attn", "post_attention_layernorm", "mlp"] * layers
    assert sum(len(h.consumers) for h in report.handoffs) == PER_LAYER * layers
    assert model.model.layers[0].self_attn.o_proj.fp8_source is getattr(model.model.layers[0].self_attn, HANDOFF_ATTR)


# ---------------------------------------------------------------------------------------------------
# The hand-off's safety, on one norm feeding two FP8 linears (a decoder layer's attention input).


class _Block(torch.nn.Module):
    def __init__(self, recipe="rowwise", n=64):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.norm = RMSNorm(n)
        self.a = Float8Linear(n, 32, bias=False, recipe=recipe)
        self.b = Float8Linear(n, 32, bias=False, recipe=recipe)
        with torch.no_grad():
            for lin in (self.a, self.b):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen))
        self.handoff = Fp8HandOff(recipe, None, (self.a, self.b))
        setattr(self.norm, HANDOFF_ATTR, self.handoff)
        self.a.fp8_source = self.b.fp8_source = self.handoff

    def forward(self, x):
        y = self.norm(x)
        return self.a(y) + self.b(y)


def _x(seed=0):
    return torch.randn(4, 64, generator=torch.Generator().manual_seed(seed))


def _plain(lin, y):
    return wavefront.ops.linear_fp8(y, lin.weight, recipe=lin.recipe)


def test_the_copy_goes_to_its_consumers_once_then_is_dropped():
    block = _Block()
    x = _x()
    y = block.norm(x)
    assert type(y) is torch.Tensor and block.handoff._copy is not None
    q, s = wavefront.ops.quantize(y, dtype="e4m3", scaling="rowwise", pow2_scale=True)
    given = block.handoff.take(y.view(4, 64), "rowwise", None)  # a view of the same storage is the same tensor
    assert torch.equal(given.data.view(torch.uint8), q.view(torch.uint8)) and torch.equal(given.scale, s)
    assert block.handoff.take(y, "blockwise", None) is None, "a consumer of another recipe sees the plain tensor"
    assert block.handoff.take(y, "rowwise", True) is None, "nor one of another format"
    assert block.handoff.take(y, "rowwise", None) is given
    assert block.handoff._copy is None, "dropped after the last linked consumer: not held until the backward"
    assert block.handoff.take(y, "rowwise", None) is None
    assert torch.equal(block(x), _plain(block.a, y) + _plain(block.b, y))


def test_float8linear_takes_an_explicit_copy_bit_identically():
    block = _Block("mxfp8")
    y = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(7))
    q, s = wavefront.ops.quantize(y, dtype="e4m3", scaling="block1x32", pow2_scale=True)
    given = wavefront.ops.Quantized(q, s, "block1x32")
    assert torch.equal(block.a(y, x_fp8=given), _plain(block.a, y))
    with pytest.raises(ValueError, match="x_fp8"):
        block.a(y, x_fp8=wavefront.ops.Quantized(q, s, "rowwise"))


def test_a_stale_copy_is_never_used():
    block = _Block()
    y = block.norm(_x())
    y.mul_(3.0)  # modified in place after the producer ran
    assert block.handoff.take(y, "rowwise", None) is None
    assert torch.equal(block.a(y), _plain(block.a, y))
    # The producer run twice before its consumers: the first output's copy is gone, not the second's given.
    y1 = block.norm(_x(1))
    y2 = block.norm(_x(2))
    assert block.handoff.take(y1, "rowwise", None) is None
    assert torch.equal(block.a(y1), _plain(block.a, y1))
    assert block.handoff.take(y2, "rowwise", None) is not None
    # Another tensor with the copy's shape and values, not the output itself, is not taken.
    y3 = block.norm(_x(3))
    assert block.handoff.take(y3.clone(), "rowwise", None) is None
    # The output dead: its memory may hold another tensor now.
    block.norm(_x(4))
    assert block.handoff.take(torch.empty(4, 64), "rowwise", None) is None


def test_copies_and_pickles_carry_the_link_never_a_pending_copy():
    block = _Block()
    block.norm(_x())
    assert block.handoff._copy is not None
    twin = copy.deepcopy(block)
    assert twin.handoff._copy is None and twin.a.fp8_source is twin.handoff is getattr(twin.norm, HANDOFF_ATTR)
    assert twin.handoff.consumers == (twin.a, twin.b)
    loaded = pickle.loads(pickle.dumps(block))
    assert loaded.handoff._copy is None
    x = _x(5)
    assert torch.equal(loaded(x), block(x))


def test_compiled_fullgraph_runs_without_the_hand_off():
    block = _Block("blockwise", n=128)
    x = _x().repeat(1, 2)
    eager = block(x)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), eager)
    assert block.handoff._copy is None, "no copy is emitted inside a compiled graph"


def test_inference_mode_skips_the_hand_off():
    block = _Block()
    x = _x()
    expected = block(x)
    with torch.inference_mode():
        assert torch.equal(block(x), expected)
    assert block.handoff._copy is None


@pytest.mark.slow
def test_activation_checkpointing_recomputes_with_the_hand_off(tiny):
    base = tiny("llama", num_hidden_layers=1).to(torch.bfloat16)
    ids = torch.randint(0, base.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(0))
    runs = []
    for fused in (True, False):
        model = copy.deepcopy(base)
        model.gradient_checkpointing_enable()
        model.train()
        wavefront.patch(model, fp8=Fp8Config("rowwise", fused_producers=fused))
        runs.append(_run(model, ids)[:2])
    (loss1, grads1), (loss0, grads0) = runs
    assert torch.equal(loss1, loss0) and all(torch.equal(grads1[k], grads0[k]) for k in grads0)
