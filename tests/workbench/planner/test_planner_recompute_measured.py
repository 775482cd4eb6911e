"""The planner's activation checkpointing policies against `wavefront train --recompute` on a tiny Llama.

`wavefront train --recompute none|full|op|every-other` applies train/recompute.py to a Hugging Face model;
here the same function is applied to a tiny Llama (the `tiny-llama` preset, widened so that every term
is distinct) in bf16 on CPU, and what the run holds is measured with the live-bytes meter
(workbench.bench.live_bytes: every storage an op allocates, until it is freed). The saved-tensor hooks of
workbench.bench.memory_measure cannot see these policies: non-reentrant checkpointing keeps its inputs in
a closure and selective checkpointing keeps the saved matmul outputs in its own cache.

- Retained after forward, per layer: the difference between a 4-layer and a 2-layer model over 2 (the
  embedding, head and loss are the same in both), against planner.model.layer_activation_bytes with
  kernels="eager" (the unpatched model's eager modules).
- The backward's transient (the peak over forward + backward minus what forward retained, gradients
  allocated before the measured step), against the planner's recompute working set (memory.py: the full
  activations of one layer minus what the policy keeps).
- Losses and gradients are bitwise the same under every policy: recomputation changes what is stored,
  not what is computed.

docs/planner.md ("Checkpointing policies, measured") has the table these tests print (run with -s).
"""

from __future__ import annotations

import pytest
import torch

from wavefront.shapes import ModelDims
from wavefront.workbench.planner.model import ModelSpec, layer_activation_bytes

pytest.importorskip("transformers")

#: (seq, batch, hidden, ffn, heads, kv heads, head dim, vocab): f = 2h, q_dim = h, kv_dim = h/2; a small
#: vocabulary keeps the (eager, unmodelled) loss path from setting the peak.
S, B, H, F, A, KV, D, V = 32, 2, 64, 128, 4, 2, 16, 8
POLICIES = ("none", "full", "op", "every-other")
_CACHE: dict = {}


def _model(n_layers: int, policy: str, patch: bool = False):
    import wavefront
    from wavefront.workbench.distributed.train import recompute
    from wavefront.workbench.distributed.train.presets import build_model

    model = build_model("tiny-llama", seed=0, attn_implementation="sdpa", num_hidden_layers=n_layers, hidden_size=H,
                        intermediate_size=F, num_attention_heads=A, num_key_value_heads=KV, head_dim=D,
                        vocab_size=V).to(torch.bfloat16)
    if patch:  # fused norms, SwiGLU, RoPE and flash attention: the planner's kernels="fused" formula
        wavefront.patch(model, loss=False)
    model.config.use_cache = False
    n = recompute.apply(model, policy)
    assert n == {"none": 0, "full": n_layers, "op": n_layers, "every-other": (n_layers + 1) // 2}[policy]
    return model.train()


def _ids() -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))


def _measure(n_layers: int, policy: str, patch: bool = False) -> tuple[int, int, torch.Tensor, dict]:
    """(bytes live after forward, peak bytes over forward + backward, loss, gradients) of one training
    step, the gradients allocated (zeros) before it, so the peak is activations and backward temporaries."""
    from wavefront.workbench.bench.live_bytes import LiveBytesMeter

    key = (n_layers, policy, patch)
    if key not in _CACHE:
        model, ids = _model(n_layers, policy, patch), _ids()
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        with LiveBytesMeter() as meter:
            loss = model(input_ids=ids, labels=ids).loss
            retained = meter.result.live_bytes
            loss.backward()
        _CACHE[key] = (retained, meter.result.peak_bytes, loss.detach(),
                       {n: p.grad for n, p in model.named_parameters()})
    return _CACHE[key]


def _spec() -> ModelSpec:
    return ModelSpec(ModelDims("tiny-llama-wide", H, F, 1, A, KV, D, V, S), kernels="eager")


def _predicted(policy: str) -> float:
    return layer_activation_bytes(_spec(), seq_len=S, micro_batch=B, tp=1, sp=False, recompute=policy)


#: Measured minus predicted bytes per layer: the eager RMSNorms' float32 rstd per row (4 B per token per
#: norm, two per layer), the only tensor outside the formula, kept by the layers that are not recomputed.
OUTSIDE = {"none": 8 * S * B, "full": 0, "op": 0, "every-other": 4 * S * B}


@pytest.mark.parametrize("policy", POLICIES)
def test_retained_bytes_per_layer_match_the_planner_per_policy(policy):
    r2, r4 = _measure(2, policy)[0], _measure(4, policy)[0]
    measured, predicted = (r4 - r2) / 2, _predicted(policy)
    print(f"\n--recompute {policy}: retained per layer {measured:.0f} B, planner {predicted:.0f} B "
          f"({measured / predicted - 1:+.2%})")
    assert measured - predicted == OUTSIDE[policy]
    if policy == "full":  # the layer input only
        assert predicted == 2 * S * B * H
    if policy == "every-other":  # half the layers keep everything, half their input
        assert predicted == 0.5 * (_predicted("none") + 2 * S * B * H)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_wavefront_patched_retained_bytes_per_layer_match_the_fused_formula(policy):
    """The patched model (wavefront's fused kernels, its attention op saved by the op policy) against the
    kernels="fused" formula; outside it, the fused norms' float32 rstd (the same 8 B per token per layer)."""
    r2, r4 = _measure(2, policy, patch=True)[0], _measure(4, policy, patch=True)[0]
    spec = ModelSpec(_spec().dims)
    measured = (r4 - r2) / 2
    predicted = layer_activation_bytes(spec, seq_len=S, micro_batch=B, tp=1, sp=False, recompute=policy)
    print(f"\npatched, --recompute {policy}: retained per layer {measured:.0f} B, planner {predicted:.0f} B "
          f"({measured / predicted - 1:+.2%})")
    assert measured - predicted == OUTSIDE[policy]


def test_backward_transient_against_the_planners_recompute_working_set():
    """Findings pinned (the planner's memory.py keeps its conservative terms): full recomputation's
    transient is the planner's working set (one layer rebuilt) within 2%; every-other's is none's, not one
    layer more (the checkpointed layer is rebuilt after the layer above it freed its activations, so the
    planner's term is an upper bound); none's is the backward's own temporaries, which the planner does not
    model (0.3-0.4 of a layer's activations here); op's lies between (its working set plus those)."""
    full_layer = _predicted("none")
    rows = {}
    for policy in POLICIES:
        retained, peak = _measure(2, policy)[:2]
        kept = _predicted(policy) if policy == "op" else 0.0
        working = 0.0 if policy == "none" else full_layer - kept
        rows[policy] = (peak - retained, working)
        print(f"\n--recompute {policy}: peak {peak} B, retained {retained} B, transient {peak - retained} B, "
              f"planner working set {working:.0f} B")
    assert abs(rows["full"][0] / rows["full"][1] - 1) <= 0.02
    assert rows["every-other"][0] == rows["none"][0] < rows["every-other"][1]
    assert 0.25 * full_layer <= rows["none"][0] <= 0.45 * full_layer
    assert rows["op"][1] < rows["op"][0] < rows["op"][1] + rows["none"][0]


@pytest.mark.parametrize("n_layers", [2, 4])
def test_loss_and_gradients_are_identical_under_every_policy(n_layers):
    _, _, ref_loss, ref_grads = _measure(n_layers, "none")
    for policy in POLICIES[1:]:  # every-other: layers 0 (and 2) recomputed, 1 (and 3) not
        _, _, loss, grads = _measure(n_layers, policy)
        assert torch.equal(loss, ref_loss), policy
        assert grads.keys() == ref_grads.keys()
        assert all(torch.equal(grads[n], g) for n, g in ref_grads.items()), policy


def test_bad_policy_and_a_model_without_checkpointable_layers_are_named():
    from wavefront.workbench.distributed.train import recompute

    with pytest.raises(ValueError, match="recompute must be one of none, full, op, every-other"):
        recompute.apply(torch.nn.Linear(2, 2), "selective")
    with pytest.raises(ValueError, match="--recompute op: Linear has no Hugging Face checkpointable layers"):
        recompute.apply(torch.nn.Linear(2, 2), "op")
    assert recompute.apply(torch.nn.Linear(2, 2), "none") == 0
    assert [recompute.from_plan(p) for p in ("none", "selective", "op", "every-other", "full")] == [
        "none", "none", "op", "every-other", "full"]


def test_train_config_recompute_flag_and_plans(tmp_path):
    """--recompute is validated with the other options; --activation-checkpointing is --recompute full; a
    --plan file's policy runs unless the command line names one (the planner's selective runs as none)."""
    import json

    from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig, apply_plan

    with pytest.raises(ConfigError, match="--recompute must be one of none, full, op, every-other, got 'some'"):
        TrainConfig(recompute="some", store=None).validate(1)
    with pytest.raises(ConfigError, match="--activation-checkpointing is --recompute full; it contradicts --recom"):
        TrainConfig(recompute="op", activation_checkpointing=True, store=None).validate(1)
    TrainConfig(recompute="every-other", store=None).validate(1)
    assert TrainConfig(activation_checkpointing=True).recompute_policy == "full"
    assert TrainConfig(recompute="op").recompute_policy == "op"

    def planned(in_plan: str, **cli) -> str:
        doc = {"schema": "wavefront.plan/1", "plans": [{"config": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2,
                                                                   "recompute": in_plan}}]}
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(doc))
        return apply_plan(TrainConfig(plan=str(path), **cli)).recompute_policy

    assert [planned(r) for r in ("none", "selective", "op", "every-other", "full")] == [
        "none", "none", "op", "every-other", "full"]
    assert planned("full", recompute="op") == "op"
    assert planned("op", activation_checkpointing=True) == "full"


@pytest.mark.slow
def test_pp2_1f1b_micro_batches_in_flight_match_the_planner():
    """PP2 1F1B over 2 gloo ranks, 4 micro-batches (pp_inflight.py): the first stage holds min(pp, m) = 2
    micro-batches in flight and the last 1, as planner.memory counts them; in bytes, the step's peak is that
    many micro-batches' activations plus a backward transient of less than one more."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from wavefront.workbench.planner import PlanConfig, Training, make_cluster
    from wavefront.workbench.planner.memory import memory_breakdown

    src = str(Path(__file__).resolve().parents[3] / "src")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    worker = Path(__file__).with_name("pp_inflight.py")
    r = subprocess.run([sys.executable, str(worker)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = {d["rank"]: d for d in (json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))}
    n_micro = ranks[0]["n_micro"]
    spec = ModelSpec(ModelDims("tiny-llama-wide", H, F, 4, A, KV, D, V, S), kernels="eager")
    training = Training(global_batch_tokens=n_micro * 2 * S, seq_len=S)
    mem = memory_breakdown(spec, PlanConfig(pp=2, dp=1, micro_batch=2), training, make_cluster("2xh100"))
    assert (mem.stage, mem.inflight_micro_batches) == ("first", 2)
    for rank, planned in ((0, mem.inflight_micro_batches), (1, 1)):
        d = ranks[rank]
        held = d["peak_bytes"] / d["per_micro_batch_bytes"]
        print(f"\nPP2 1F1B, {n_micro} micro-batches, rank {rank}: {d['inflight_counted']} in flight (planner "
              f"{planned}); peak {d['peak_bytes']} B = {held:.2f} x one micro-batch's {d['per_micro_batch_bytes']} B")
        assert d["inflight_counted"] == planned
        assert planned <= held < planned + 1
