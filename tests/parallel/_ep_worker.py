"""Worker for tests/parallel/test_expert_parallel.py, run under torchrun (gloo, CPU, Triton interpreter).

Checks, each rank holding half of the tokens and half of the experts:
- layer: one wavefront.nn.MoE (4 experts, top-2) in float32 with expert parallelism against the same layer in
  float64 on all tokens in one process; output, input gradient, router and expert weight gradients under the
  accuracy rule (eager = plain-PyTorch MoE in float32).
- train: a one-layer Mixtral (transformers, patched MoE, 4 experts, top-2) trained a few AdamW steps with EP
  (dense gradients averaged by all-reduce) against one process on the global batch: loss per step and the final
  weights (full state dict, all-gathered experts) against float64 within twice the unpatched float32 runs'
  envelope (the convergence proof's derived tolerance); plus a state_dict round trip (the full checkpoint loads
  into a full model and back into a fresh EP model).
- fsdp: the same training with FSDP2 fully_shard over the non-expert parameters (same 2 ranks).
- mesh (4 processes): a (dp 2, ep 2) mesh, FSDP2 over all 4 ranks for the dense part, experts averaged over dp.
Rank 0 writes the results as JSON to argv[1]."""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _torchrun import process_group, report  # this folder is on sys.path: torchrun runs the worker as a script

import wavefront
from wavefront.nn import MoE
from wavefront.ops._spec import Tolerance
from wavefront.parallel import ExpertParallelExperts, expert_parallel, expert_parameters

STEPS, BATCH, SEQ, LR = 3, 2, 4, 3e-2


def _err(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


def _check(name: str, ours, ref, eager, dtype) -> dict:
    eager_err = _err(eager, ref)
    return {"name": name, "ours_err": _err(ours, ref), "eager_err": eager_err,
            "bound": Tolerance().bound(eager_err, float(ref.abs().max()), dtype),
            "finite": bool(torch.isfinite(ours).all()), "shape_ok": tuple(ours.shape) == tuple(ref.shape)}


def _eager_moe(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """What plain PyTorch MoE code computes: softmax, top-k, renormalize, one F.linear pair per expert."""
    probs = torch.softmax(F.linear(x, layer.gate.weight), -1)
    w, idx = probs.topk(layer.top_k, -1)
    return _eager_experts(layer.experts.gate_up_proj, layer.experts.down_proj, x, idx, w / w.sum(-1, keepdim=True))


def _eager_experts(gate_up, down, x, idx, w):
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        gate, up = F.linear(x[tok], gate_up[e]).chunk(2, -1)
        out = out.index_add(0, tok, w[tok, slot, None] * F.linear(F.silu(gate) * up, down[e]))
    return out


def _gather_rows(t: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def _layer_checks(rank: int, world: int) -> list[dict]:
    gen = torch.Generator().manual_seed(7)
    n_tok, hidden = 6 * world, 16
    torch.manual_seed(0)
    base = MoE(hidden, 8, 4, 2, dtype=torch.float64)
    x64 = torch.randn(n_tok, hidden, generator=gen, dtype=torch.float64)
    dy64 = torch.randn(n_tok, hidden, generator=gen, dtype=torch.float64)

    def run(layer, x, dy, fn=None):
        x = x.detach().clone().requires_grad_()
        y = layer(x) if fn is None else fn(layer, x)
        (y * dy.to(y.dtype)).sum().backward()
        return {"out": y.detach(), "dx": x.grad, "d_router": layer.gate.weight.grad,
                "d_gate_up": layer.experts.gate_up_proj.grad, "d_down": layer.experts.down_proj.grad}

    f32, ep, ep_mean = (copy.deepcopy(base).float() for _ in range(3))
    ref = run(base, x64, dy64)
    eager = run(f32, x64.float(), dy64, _eager_moe)
    paths = expert_parallel(ep, grad_scale=1.0)  # a sum loss: expert gradients are already the full sums
    lo, hi = rank * 6, (rank + 1) * 6
    mine = run(ep, x64[lo:hi].float(), dy64[lo:hi])
    dense = mine["d_router"].clone()
    dist.all_reduce(dense)
    ours = {"out": _gather_rows(mine["out"]), "dx": _gather_rows(mine["dx"]), "d_router": dense,
            "d_gate_up": _gather_rows(mine["d_gate_up"]), "d_down": _gather_rows(mine["d_down"])}
    results = [_check(f"layer/{k}", ours[k], ref[k], eager[k], torch.float32) for k in ref]
    # Default grad_scale 1/P (dense gradients averaged over the ranks): exactly the summed gradient / P.
    expert_parallel(ep_mean)
    scaled = run(ep_mean, x64[lo:hi].float(), dy64[lo:hi])
    results.append({"name": "layer/grad_scale", "ok": bool(
        torch.equal(_gather_rows(scaled["d_gate_up"]) * world, ours["d_gate_up"])
        and torch.equal(_gather_rows(scaled["d_down"]) * world, ours["d_down"])
        and torch.equal(scaled["dx"], mine["dx"]))})
    results.append({"name": "layer/converted", "ok": paths == ["experts"]
                    and isinstance(ep.experts, ExpertParallelExperts)
                    and tuple(ep.experts.gate_up_proj.shape) == (2, 16, 16)})
    results += _edge_checks(base, ep.experts, rank, world)
    return results


def _edge_checks(base: MoE, ep_experts: ExpertParallelExperts, rank: int, world: int) -> list[dict]:
    """Every token routed to rank 0's experts (rank 1 receives no rows, sends all), and the argument errors."""
    gen = torch.Generator().manual_seed(11)
    ep_experts.zero_grad(set_to_none=True)
    x64 = torch.randn(5 * world, 16, generator=gen, dtype=torch.float64)
    idx = torch.randint(0, 2, (5 * world, 1), generator=gen) + torch.tensor([[0, 0]])
    idx[:, 1] = 1 - idx[:, 0]
    w64 = torch.rand(5 * world, 2, generator=gen, dtype=torch.float64)
    ref = base.experts(x64, idx, w64)
    lo, hi = rank * 5, (rank + 1) * 5
    x = x64[lo:hi].float().requires_grad_()
    out = ep_experts(x, idx[lo:hi], w64[lo:hi].float())
    out.sum().backward()
    with torch.no_grad():
        eager = _eager_experts(base.experts.gate_up_proj.float(), base.experts.down_proj.float(), x64.float(), idx,
                               w64.float())
    got_grad = bool(ep_experts.gate_up_proj.grad.abs().sum() > 0)  # only rank 0's experts saw tokens
    results = [_check("skewed/out", _gather_rows(out.detach()), ref, eager, torch.float32),
               {"name": "skewed/backward", "ok": bool(torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0)
                and got_grad == (rank == 0)}]
    errors = []
    for fn, match in ((lambda: expert_parallel(MoE(8, 4, 3, 2)), "3 experts, not divisible"),
                      (lambda: expert_parallel(MoE(8, 4, 4, 2, pad_to=4)), "pad_to=4 is not supported")):
        try:
            fn()
            errors.append(False)
        except ValueError as e:
            errors.append(match in str(e))
    results.append({"name": "layer/errors", "ok": all(errors)})
    return results


def _mixtral(dtype, patched: bool):
    import transformers

    config = transformers.MixtralConfig(vocab_size=64, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=64, tie_word_embeddings=False, intermediate_size=12,
                                        num_hidden_layers=1, num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "eager"  # plain per-expert loops (torch._grouped_mm has no float64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(dtype)
    if patched:
        wavefront.patch(model, rms_norm=False, layer_norm=False, rope=False, mlp=False, loss=False, moe=True)
    return model


def _batches(world: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 64, (BATCH * world, SEQ), generator=gen) for _ in range(STEPS)]


def _train(model, batches, rank: int | None, world: int, fsdp: bool = False, expert_dp=None) -> list[float]:
    """rank None: one process on the whole batch. Else this rank's share; the global loss is the ranks' mean.
    expert_dp: the group of ranks holding the same experts (2-D mesh): their expert gradients are averaged."""
    experts = expert_parameters(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for ids in batches:
        if rank is not None:
            ids = ids[rank * BATCH:(rank + 1) * BATCH]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if rank is not None and not fsdp:
            for p in model.parameters():
                if p.grad is not None and p not in experts:
                    dist.all_reduce(p.grad)
                    p.grad /= world
        if expert_dp is not None:  # model order, the same on every rank (a set iterates in id() order)
            for p in (p for p in model.parameters() if p in experts):
                dist.all_reduce(p.grad, group=expert_dp)
                p.grad /= dist.get_world_size(expert_dp)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().double()
        if rank is not None:
            dist.all_reduce(value)
            value /= world
        losses.append(float(value))
    return losses


def _nudge(model, seed: int) -> None:
    """Move every weight by one ulp in a random direction (a rounding-level perturbation)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            sign = torch.randint(0, 2, p.shape, generator=gen).to(p.dtype) * 2 - 1
            p.copy_(torch.nextafter(p, p + sign))


def _train_checks(rank: int, world: int, mesh_2d: bool = False) -> list[dict]:
    """Tolerance as tests/patching/test_convergence.py derives it: the unpatched float32 runs (plus two whose
    initial weights moved by one ulp) give the envelope env of rounding-level drift around float64;
    ours passes at 2 * env (running max over steps for the loss) + 4 fp32 ulps of the value."""
    batches = _batches(world)
    ref_model = _mixtral(torch.float64, False)
    ref = _train(ref_model, batches, None, world)
    ref_sd = ref_model.state_dict()
    eager_runs = []
    for seed in (None, 1, 2):
        m = _mixtral(torch.float32, False)
        if seed is not None:
            _nudge(m, seed)
        eager_runs.append((_train(m, batches, None, world), m.state_dict()))
    eps = torch.finfo(torch.float32).eps
    results = []

    def compare(prefix: str, losses, state) -> None:
        env = 0.0
        for step, (o, r) in enumerate(zip(losses, ref, strict=True)):
            env = max(env, *(abs(run[0][step] - r) for run in eager_runs))
            results.append({"name": f"{prefix}/loss{step}", "ours_err": abs(o - r), "eager_err": env,
                            "bound": 2 * env + 4 * eps * abs(r), "finite": bool(o == o), "shape_ok": True})
        for key in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
                    "model.layers.0.mlp.gate.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"):
            env = max(_err(run[1][key], ref_sd[key]) for run in eager_runs)
            results.append({"name": f"{prefix}/{key}", "ours_err": _err(state[key], ref_sd[key]), "eager_err": env,
                            "bound": 2 * env + 4 * eps * float(ref_sd[key].abs().max()),
                            "finite": bool(torch.isfinite(state[key]).all()),
                            "shape_ok": tuple(state[key].shape) == tuple(ref_sd[key].shape)})

    from torch.distributed.fsdp import fully_shard

    if mesh_2d:
        # 4 ranks as a (dp 2, ep 2) mesh: experts split over "ep" ({0, 1}, {2, 3}), their gradients averaged over
        # "dp" ({0, 2}, {1, 3}); FSDP2 shards the dense parameters over all 4 ranks.
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
        model = _mixtral(torch.float32, True)
        expert_parallel(model, mesh["ep"].get_group())
        for layer in model.model.layers:
            fully_shard(layer, ignored_params=expert_parameters(model))
        fully_shard(model, ignored_params=expert_parameters(model))
        losses = _train(model, batches, rank, world, fsdp=True, expert_dp=mesh["dp"].get_group())
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
        compare("mesh", losses, state)
        return results

    # EP2 with all-reduced dense gradients.
    model = _mixtral(torch.float32, True)
    expert_parallel(model)
    losses = _train(model, batches, rank, world)
    state = model.state_dict()
    compare("train", losses, state)
    # Round trip: the full checkpoint loads into a full (unsharded) model and back into a fresh EP model.
    full = _mixtral(torch.float32, False)
    full.load_state_dict(state)
    again = _mixtral(torch.float32, True)
    expert_parallel(again)
    again.load_state_dict(state)
    experts = again.model.layers[0].mlp.experts
    lo, hi = experts.local_range
    results.append({"name": "train/state_dict_roundtrip", "ok": bool(
        torch.equal(full.model.layers[0].mlp.experts.gate_up_proj, state["model.layers.0.mlp.experts.gate_up_proj"])
        and torch.equal(experts.gate_up_proj, state["model.layers.0.mlp.experts.gate_up_proj"][lo:hi])
        and torch.equal(experts.down_proj, model.model.layers[0].mlp.experts.down_proj)
        and tuple(state["model.layers.0.mlp.experts.down_proj"].shape) == (4, 16, 12))})

    # EP2 x FSDP2: fully_shard over the dense parameters of the same ranks; experts ignored (expert-parallel).
    model = _mixtral(torch.float32, True)
    expert_parallel(model)
    expert_params = expert_parameters(model)
    assert len(expert_params) == 2 and all(p.shape[0] == 2 for p in expert_params)
    for layer in model.model.layers:
        fully_shard(layer, ignored_params=expert_params)
    fully_shard(model, ignored_params=expert_params)
    losses = _train(model, batches, rank, world, fsdp=True)
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    compare("fsdp", losses, state)
    return results


def main() -> None:
    torch.set_num_threads(1)
    with process_group(sys.argv[1]) as (rank, world):
        wanted = sys.argv[2].split(",") if len(sys.argv) > 2 else ["layer", "train"] if world == 2 else ["mesh"]
        results = []
        if "layer" in wanted:
            results += _layer_checks(rank, world)
        if "train" in wanted:
            results += _train_checks(rank, world)
        if "mesh" in wanted:
            results += _train_checks(rank, world, mesh_2d=True)
        report(results, sys.argv[1])


if __name__ == "__main__":
    main()
