"""The RoPE, gated-MLP and fused-loss mechanisms (instance class swap, Linear-reusing MLP, loss hooks).

Where a kernel is not in this build yet, a plain PyTorch stand-in with the documented signature takes
its place (monkeypatched onto wavefront.ops for the test only), so these tests check the *wiring*: the
right module calls the op with the right tensors and the model's results, state_dict and unpatch are
unchanged. Once the real kernel is present the same tests run against it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import wavefront
from wavefront import ops


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rope(q, k, cos, sin, *, position_ids=None):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    r = cos.shape[-1]

    def rot(x):
        return torch.cat([x[..., :r] * cos + _rotate_half(x[..., :r]) * sin, x[..., r:]], dim=-1)

    return rot(q), rot(k)


def _linear_cross_entropy(hidden, weight, target, *, bias=None, ignore_index=-100, softcap=None, reduction="mean",
                          **_):
    logits = F.linear(hidden, weight, bias).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction)


STAND_INS = {
    "rope": _rope,
    "swiglu": lambda gate, up: F.silu(gate) * up,
    "geglu": lambda gate, up, approximate="tanh": F.gelu(gate, approximate=approximate) * up,
    "linear_cross_entropy": _linear_cross_entropy,
}


@pytest.fixture
def all_ops(monkeypatch):
    calls: dict[str, int] = {}
    for name, fn in STAND_INS.items():
        if not hasattr(ops, name):
            def counted(*a, _fn=fn, _name=name, **kw):
                calls[_name] = calls.get(_name, 0) + 1
                return _fn(*a, **kw)

            monkeypatch.setattr(ops, name, counted, raising=False)
    return calls


def test_full_patch_matches_unpatched_training_step(family, tiny, all_ops, uncovered):
    # One layer holds every module kind the patch swaps (norms, RoPE attention, MLP) and the head's fused
    # loss; a second layer would only repeat the same kernels under the interpreter.
    model = tiny(family, num_hidden_layers=1)
    model.train()
    ref = copy.deepcopy(model)
    refused = uncovered(family) - {"attention"}  # attention is off by default
    report = wavefront.patch(model, **dict.fromkeys(refused, False))
    assert report.ok, str(report)
    counts = report.counts()
    assert set(counts) - {"layer_norm"} == {"rms_norm", "rope", "mlp", "loss"} - refused
    assert counts.get("layer_norm", 0) == sum(type(m) is torch.nn.LayerNorm for m in ref.modules())  # a vision tower
    if refused:  # strict: what the rules do not cover is refused, and the model is left unpatched
        probe = copy.deepcopy(ref)
        with pytest.raises(wavefront.patching.PatchError, match="|".join(sorted(refused))):
            wavefront.patch(probe)
        assert not wavefront.patching.is_patched(probe)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    n_items = torch.tensor(11)
    out = model(input_ids=ids, labels=ids, num_items_in_batch=n_items)
    assert (out.logits is None) == ("loss" not in refused), "in training the fused loss must not materialize logits"
    out.loss.backward()
    ref_out = ref(input_ids=ids, labels=ids, num_items_in_batch=n_items)
    ref_out.loss.backward()
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    for name in ("rope", "linear_cross_entropy"):
        if name in STAND_INS and name in all_ops:
            assert all_ops[name] > 0, f"{name} was never called"

    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref.eval()(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)


def test_unpatch_restores_attention_class_head_and_hooks(tiny, all_ops):
    model = tiny("llama")
    attn_cls = type(model.model.layers[0].self_attn)
    head = model.lm_head
    wavefront.patch(model)
    assert type(model.model.layers[0].self_attn).__name__ == f"Wavefront{attn_cls.__name__}"
    assert isinstance(model.model.layers[0].self_attn, attn_cls)
    assert model._forward_pre_hooks and model.lm_head is not head
    wavefront.unpatch(model)
    assert type(model.model.layers[0].self_attn) is attn_cls
    assert model.lm_head is head and not model._forward_pre_hooks and not model._forward_hooks
    import transformers.models.llama.modeling_llama as hf_llama

    assert hf_llama.apply_rotary_pos_emb.__module__ == hf_llama.__name__, "transformers must never be rebound"


def test_fused_loss_honours_ignore_index_and_shift_labels(tiny, all_ops):
    model = tiny("gemma2", num_hidden_layers=1)  # the loss is wired at the head: one layer suffices
    model.train()
    ref = copy.deepcopy(model)
    wavefront.patch(model)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :3] = -100
    torch.testing.assert_close(model(input_ids=ids, labels=labels).loss, ref(input_ids=ids, labels=labels).loss)
    shift = torch.roll(ids, -1, dims=1)
    fused = model(input_ids=ids, labels=ids, shift_labels=shift).loss
    torch.testing.assert_close(fused, ref(input_ids=ids, labels=ids, shift_labels=shift).loss)
    assert not torch.allclose(fused, model(input_ids=ids, labels=ids).loss), "shift_labels must be used as given"
    assert model(input_ids=ids, shift_labels=shift).loss is None


def test_tied_head_keeps_sharing_the_embedding(tiny, all_ops):
    model = tiny("gemma")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    wavefront.patch(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len(list(model.parameters())) == len(dict(model.named_parameters()))


def test_fused_loss_exposes_token_accuracy_and_z_loss(tiny, all_ops):
    """loss_metrics(model): the token accuracy and the z-loss term of the last training forward, the same values
    as the full logits give (argmax against the shifted labels; PaLM's z-loss per token), and the z-loss
    coefficient on the head enters the training loss."""
    model = tiny("llama", num_hidden_layers=1)
    model.train()
    ref = copy.deepcopy(model)
    assert wavefront.patching.loss_metrics(model) is None
    wavefront.patch(model)
    assert wavefront.patching.loss_metrics(model) is None  # no training forward with labels yet
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :2] = -100
    model.lm_head.z_loss = 1e-2
    loss = model(input_ids=ids, labels=labels).loss
    metrics = wavefront.patching.loss_metrics(model)
    logits = ref(input_ids=ids).logits.float()
    target = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
    valid = target != -100
    rows = logits.reshape(-1, logits.shape[-1])
    predicted = rows.argmax(-1)
    torch.testing.assert_close(metrics.token_accuracy, ((predicted == target) & valid).sum() / valid.sum())
    lse = torch.logsumexp(rows, dim=-1)
    z_term = 1e-2 * (lse[valid] ** 2).mean()
    torch.testing.assert_close(metrics.z_loss, z_term)
    torch.testing.assert_close(loss, ref(input_ids=ids, labels=labels).loss + z_term)
    assert torch.equal(metrics.loss, loss.detach()) and not metrics.loss.requires_grad
    model.eval()
    model(input_ids=ids, labels=labels)  # eval: transformers' own loss; the metrics stay the last training call's
    assert torch.equal(wavefront.patching.loss_metrics(model).loss, metrics.loss)
    model.train()
    model.lm_head.metrics = False  # no token accuracy: the kernel's plain variant; the z-loss term stays
    again = model(input_ids=ids, labels=labels).loss
    off = wavefront.patching.loss_metrics(model)
    assert off.token_accuracy is None and torch.equal(off.z_loss, metrics.z_loss) and torch.equal(again, loss)
