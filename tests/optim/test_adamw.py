"""wavefront.optim.AdamW against torch.optim.AdamW(foreach=False): arithmetic over 100 steps, param groups,
schedulers, state dicts both ways, master weights, and one launch per dtype group."""

from __future__ import annotations

import copy

import pytest
import torch

from wavefront.kernels._launch import recording
from wavefront.optim import AdamW

SHAPES = [(3000,), (64, 33), (7,), (), (2, 3, 5)]  # multi-block, ragged, tiny, 0-d, 3-d


def _params(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES]


def _grads(step, dtype=torch.float32):
    # Gradients that do not depend on the parameters, so both optimizers see identical inputs every step.
    gen = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(s, generator=gen) * (0.1 + step % 3)).to(dtype) for s in SHAPES]


def _groups(params, **extra):
    return [{"params": params[:2]}, {"params": params[2:], "lr": 3e-2, "weight_decay": 0.1, "betas": (0.8, 0.99),
                                     **extra}]


def _run(opt, params, steps, start=0, dtype=torch.float32, scheduler=None):
    for i in range(start, start + steps):
        for p, g in zip(params, _grads(i, dtype), strict=True):
            p.grad = g.clone()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def _ulps(a, b):
    """Largest difference in fp32 ulps at each tensor's scale (eps times its largest magnitude)."""
    return max(float((x - y).abs().max() / (torch.finfo(torch.float32).eps * y.abs().max()))
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("options", "steps"), [({}, 100), ({"amsgrad": True}, 30), ({"maximize": True}, 30)])
def test_matches_torch_over_100_steps(options, steps):
    ours_p, ref_p = _params(), _params()
    ours = AdamW(_groups(ours_p), lr=1e-2, **options)
    ref = torch.optim.AdamW(_groups(ref_p), lr=1e-2, foreach=False, **options)
    _run(ours, ours_p, steps)
    _run(ref, ref_p, steps)
    # Within fp32 rounding: a few ulps after 100 updates. The evaluation order is torch's, but torch's
    # vectorized CPU kernels (and GPUs' fused multiply-adds) move the last bit of ~1% of first-step results.
    assert _ulps([p.detach() for p in ours_p], [p.detach() for p in ref_p]) <= 8
    for p_ours, p_ref in zip(ours_p, ref_p, strict=True):
        for key in ("exp_avg", "exp_avg_sq", *(["max_exp_avg_sq"] if options.get("amsgrad") else [])):
            assert _ulps([ours.state[p_ours][key]], [ref.state[p_ref][key]]) <= 8, key
        assert torch.equal(ours.state[p_ours]["step"], ref.state[p_ref]["step"])


def test_scheduler_and_state_dict_interchange():
    ours_p, ref_p = _params(), _params()
    ours = AdamW(_groups(ours_p), lr=1e-2)
    ref = torch.optim.AdamW(_groups(ref_p), lr=1e-2, foreach=False)
    sched = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.9 ** s) for o in (ours, ref)]
    _run(ours, ours_p, 10, scheduler=sched[0])
    _run(ref, ref_p, 10, scheduler=sched[1])
    assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in ref.param_groups]
    # Swap: each optimizer continues from the other's state dict (deep copies, as if saved and loaded:
    # load_state_dict keeps the given tensors, which would otherwise be shared with the source).
    ours_p2, ref_p2 = [torch.nn.Parameter(p.detach().clone()) for p in ref_p], [
        torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ours2 = AdamW(_groups(ours_p2))
    ours2.load_state_dict(copy.deepcopy(ref.state_dict()))
    ref2 = torch.optim.AdamW(_groups(ref_p2), foreach=False)
    ref2.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert ours2.param_groups[1]["lr"] == ref.param_groups[1]["lr"]
    _run(ours2, ours_p2, 10, start=10)
    _run(ref2, ref_p2, 10, start=10)
    _run(ref, ref_p, 10, start=10)  # uninterrupted run
    assert _ulps([p.detach() for p in ours_p2], [p.detach() for p in ref_p]) <= 8
    assert _ulps([p.detach() for p in ref_p2], [p.detach() for p in ref_p]) <= 8


def test_master_weights_for_bf16():
    ours_p = _params(torch.bfloat16)
    fp32_p = [torch.nn.Parameter(p.detach().float()) for p in ours_p]
    ours = AdamW(ours_p, lr=1e-3, master_weights=True)
    ref = torch.optim.AdamW(fp32_p, lr=1e-3, foreach=False)
    _run(ours, ours_p, 30, dtype=torch.bfloat16)
    for i in range(30):  # the same bf16 gradients, applied to fp32 parameters
        for p, g in zip(fp32_p, _grads(i, torch.bfloat16), strict=True):
            p.grad = g.float()
        ref.step()
    masters = [ours.state[p]["master_param"] for p in ours_p]
    assert _ulps(masters, [p.detach() for p in fp32_p]) <= 8
    for p, m in zip(ours_p, masters, strict=True):
        assert torch.equal(p.detach(), m.to(torch.bfloat16))
        assert ours.state[p]["exp_avg"].dtype == torch.float32
    # 1e-3 steps on O(1) bf16 values: without the fp32 copy most updates round away.
    plain_p = _params(torch.bfloat16)
    plain = AdamW(plain_p, lr=1e-3)
    _run(plain, plain_p, 30, dtype=torch.bfloat16)
    err_master = max(float((p.detach().float() - q.detach()).abs().max()) for p, q in zip(ours_p, fp32_p, strict=True))
    err_plain = max(float((p.detach().float() - q.detach()).abs().max()) for p, q in zip(plain_p, fp32_p, strict=True))
    assert err_master < err_plain


def test_torch_state_dict_seeds_master_weights():
    params = _params(torch.bfloat16)
    ref = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    _run(ref, params, 3, dtype=torch.bfloat16)
    ours = AdamW(params, lr=1e-3, master_weights=True)
    ours.load_state_dict(copy.deepcopy(ref.state_dict()))
    _run(ours, params, 1, start=3, dtype=torch.bfloat16)
    state = ours.state[params[0]]
    assert state["master_param"].dtype == torch.float32 and state["exp_avg"].dtype == torch.float32
    assert float(state["step"]) == 4.0


def test_one_launch_per_dtype_group():
    params = _params()
    opt = AdamW(_groups(params))
    for p, g in zip(params, _grads(0), strict=True):
        p.grad = g
    with recording() as launches:
        opt.step()
    assert len(launches) == 1  # 5 tensors in 2 param groups
    extra = torch.nn.Parameter(torch.randn(100, dtype=torch.bfloat16))
    extra.grad = torch.randn(100, dtype=torch.bfloat16)
    opt.add_param_group({"params": [extra]})
    with recording() as launches:
        opt.step()
    assert len(launches) == 2


def test_skips_params_without_grad_and_handles_non_contiguous():
    base = torch.randn(8, 6)
    strided = torch.nn.Parameter(base.t())  # non-contiguous: the op-by-op path
    idle = torch.nn.Parameter(torch.randn(4))
    ref_p = torch.nn.Parameter(base.t().clone())
    ours = AdamW([strided, idle], lr=0.1)
    ref = torch.optim.AdamW([ref_p], lr=0.1, foreach=False)
    for _ in range(3):
        g = torch.randn(6, 8)
        strided.grad, ref_p.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(strided.detach(), ref_p.detach())
    assert idle not in ours.state


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lr": -1.0}, r"'lr' must be >= 0"),
    ({"betas": (0.9, 1.0)}, r"'betas\[1\]' must be in \[0, 1\)"),
    ({"eps": -1e-8}, r"'eps' must be >= 0"),
    ({"weight_decay": -0.1}, r"'weight_decay' must be >= 0"),
])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdamW([torch.nn.Parameter(torch.randn(2))], **kwargs)


def test_sparse_grad_rejected():
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4).to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        AdamW([p]).step()


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_fp64_and_complex_parameters_match_torch(dtype):
    # Issue #13 defect 6: fp64 crashed inside Triton, complex raised KeyError. fp64 now updates in fp64; a
    # complex parameter updates as its real view, torch.optim.AdamW's rule.
    gen = torch.Generator().manual_seed(4)
    init = [torch.randn(s, generator=gen, dtype=dtype) for s in ((3000,), (7, 5))]
    ours_p = [torch.nn.Parameter(t.clone()) for t in init]
    ref_p = [torch.nn.Parameter(t.clone()) for t in init]
    ours = AdamW(ours_p, lr=1e-2, amsgrad=True)
    ref = torch.optim.AdamW(ref_p, lr=1e-2, amsgrad=True, foreach=False)
    with recording() as launches:
        for _ in range(5):
            grads = [torch.randn(t.shape, generator=gen, dtype=dtype) for t in init]
            for p, q, g in zip(ours_p, ref_p, grads, strict=True):
                p.grad, q.grad = g.clone(), g.clone()
            ours.step()
            ref.step()
    assert len(launches) == 5  # the kernel ran, not a fallback
    real = torch.float64 if dtype == torch.float64 else torch.float32
    tol = dict(rtol=1e-12, atol=1e-14) if real == torch.float64 else dict(rtol=1e-5, atol=1e-7)
    for p, q in zip(ours_p, ref_p, strict=True):
        assert p.dtype == dtype
        torch.testing.assert_close(p.detach(), q.detach(), **tol)
        torch.testing.assert_close(ours.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"], **tol)


def test_unsupported_parameter_dtype_is_named():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float8_e4m3fn), requires_grad=False)
    p.grad = torch.zeros(4, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"AdamW: parameter of dtype torch.float8_e4m3fn \(shape \(4,\)\)"):
        AdamW([p]).step()


def test_adamw_step_op_in_fp64_and_complex_refused():
    from wavefront.ops import adamw_step
    from wavefront.reference import adamw_step_eager

    gen = torch.Generator().manual_seed(5)
    p, g, m = (torch.randn(5000, generator=gen, dtype=torch.float64) for _ in range(3))
    v = torch.rand(5000, generator=gen, dtype=torch.float64)
    ours = adamw_step(p, g, m, v, lr=1e-2, step=3)
    expect = adamw_step_eager(p, g, m, v, lr=1e-2, step=3)
    for a, b in zip(ours, expect, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
    c = torch.zeros(4, dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"adamw_step: argument 'param' must have dtype"):
        adamw_step(c, c, c, c, lr=1e-3)


def test_device_tables_are_built_once_per_parameter_set():
    # Issue #16 item 4: the tables are reused across steps (no per-step host table), rebuilt when an
    # address changes, and many tensors of every size (empty, one element, ragged, several blocks) map
    # each program to the right tensor by the kernel's search.
    from wavefront.kernels import adamw as kernels

    sizes = [0, 1, 2048, 2049, 5, 0, 7000, 3, 4096, 1]
    gen = torch.Generator().manual_seed(6)
    init = [torch.randn(n, generator=gen) for n in sizes]
    ours_p = [torch.nn.Parameter(t.clone()) for t in init]
    ref_p = [torch.nn.Parameter(t.clone()) for t in init]
    ours = AdamW(ours_p, lr=1e-2)
    ref = torch.optim.AdamW(ref_p, lr=1e-2, foreach=False)
    grads = [torch.randn(n, generator=gen) for n in sizes]
    before = kernels.TABLES.builds
    for step in range(3):
        for p, q, g in zip(ours_p, ref_p, grads, strict=True):
            if step == 0 or p.grad is None:
                p.grad = g.clone()
            q.grad = g.clone()
        ours.step()
        ref.step()
    assert kernels.TABLES.builds == before + 1
    ours_p[3].grad = grads[3].clone()  # a new gradient tensor: a new address, new tables
    ref_p[3].grad = grads[3].clone()
    ours.step()
    ref.step()
    assert kernels.TABLES.builds == before + 2
    assert _ulps([p.detach() for p in ours_p if p.numel()], [p.detach() for p in ref_p if p.numel()]) <= 8


def test_capturable_step_matches_torch_without_host_work():
    # Issue #16 item 4: capturable=True keeps the step counts on the device and computes the scalars there;
    # after the first step (state and tables), a step makes no host sync and builds no host tensor, which
    # is what CUDA-graph capture needs. Same numbers as torch.optim.AdamW (whose capturable mode needs a GPU).
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "ops"))
    host_syncs = importlib.import_module("_host_sync").host_syncs
    ours_p, ref_p = _params(), _params()
    ours = AdamW(_groups(ours_p), lr=1e-2, capturable=True)
    ref = torch.optim.AdamW(_groups(ref_p), lr=1e-2, foreach=False)
    _run(ours, ours_p, 2)
    _run(ref, ref_p, 2)
    made = []
    real_tensor = torch.tensor

    def counting_tensor(*args, **kwargs):
        made.append(sys._getframe(1).f_code.co_filename)
        return real_tensor(*args, **kwargs)

    for i in range(2, 6):
        for p, g in zip(ours_p, _grads(i), strict=True):
            p.grad.copy_(g)  # static gradient buffers, as under graph capture: the device tables are reused
        torch.tensor = counting_tensor
        try:
            with host_syncs() as calls:
                ours.step()
        finally:
            torch.tensor = real_tensor
        assert calls == [], calls
        assert not [f for f in made if "wavefront" in f], made
    _run(ref, ref_p, 4, start=2)
    assert _ulps([p.detach() for p in ours_p], [p.detach() for p in ref_p]) <= 8
    state = ours.state[ours_p[0]]
    assert state["step"].device == ours_p[0].device and float(state["step"]) == 6.0


# ---------------------------------------------------------------------------------------------------
# The step's plan (issue #16 item 4, host cost): reused while nothing changed, rebuilt when anything
# did, and bit-identical to a step that rebuilds it every time.

def _twin_runs(mutate, steps=6, **opt_kw):
    """Run the same steps with the plan kept (ours) and with it dropped before every step (fresh): the
    cached path must equal the one-pass path bit for bit, whatever `mutate(i, params, opt)` changes."""
    out = []
    for keep in (True, False):
        params = _params()
        opt = AdamW(_groups(params), lr=1e-2, **opt_kw)
        for i in range(steps):
            for p, g in zip(params, _grads(i), strict=True):
                p.grad = g.clone()
            mutate(i, params, opt)
            if not keep:
                opt.__dict__.pop("_plan", None)
            opt.step()
        out.append((params, opt))
    (kept, kept_opt), (fresh, fresh_opt) = out
    for p, q in zip(kept, fresh, strict=True):
        assert torch.equal(p.detach(), q.detach())
        for key, value in kept_opt.state[p].items():
            assert torch.equal(value, fresh_opt.state[q][key]), key
    return kept, kept_opt


def test_plan_is_kept_across_steps_and_steps_share_one_tensor():
    params, opt = _twin_runs(lambda i, params, opt: None, steps=3)
    plan = opt._plan
    for p in params:
        p.grad = torch.ones_like(p)
    versions = [p._version for p in params]
    opt.step()
    assert opt._plan is plan
    assert [p._version for p in params] == [v + 1 for v in versions]  # in-place update: autograd must see it
    steps = [opt.state[p]["step"] for p in params]
    assert all(s._base is steps[0]._base for s in steps) and steps[0]._base is plan.step_bases[0]
    assert [float(s) for s in steps] == [4.0] * len(params)


def test_plan_rebuilt_on_every_kind_of_change_bit_identical():
    # One change per step, each of which must drop the plan (a stale one would update the wrong tensor or
    # read a freed address); the kept and the dropped-every-step runs must stay bit-identical throughout.
    extra = torch.nn.Parameter(torch.randn(5, generator=torch.Generator().manual_seed(3)))
    changes = {1: "grad_none", 2: "grad_non_contiguous", 3: "new_storage", 4: "state_replaced", 5: "new_group",
               6: "flags", 7: "load_state_dict"}

    def mutate(i, params, opt):
        change = changes.get(i)
        if change == "grad_none":
            params[1].grad = None
        elif change == "grad_non_contiguous":
            params[1].grad = params[1].grad.t().contiguous().t()  # (64, 33) column-major: the op-by-op path
        elif change == "new_storage":
            params[0].data = params[0].data.clone()
        elif change == "state_replaced":
            opt.state[params[0]]["exp_avg"] = torch.zeros_like(params[0])
        elif change == "new_group":
            p = torch.nn.Parameter(extra.detach().clone())
            p.grad = torch.ones_like(p)
            opt.add_param_group({"params": [p]})
        elif change == "flags":
            opt.param_groups[1]["amsgrad"] = True
        elif change == "load_state_dict":
            opt.load_state_dict(copy.deepcopy(opt.state_dict()))

    params, opt = _twin_runs(mutate, steps=9)
    assert float(opt.state[params[1]]["step"]) == 8.0  # skipped once
    assert float(opt.state[params[0]]["step"]) == 9.0
    assert "max_exp_avg_sq" in opt.state[params[2]]  # amsgrad turned on in its group


def test_direct_launch_equals_the_custom_op():
    # Eager steps launch the kernel directly; under the autograd profiler (as under torch.compile or a
    # dispatch mode) the custom op runs instead: the same numbers.
    results = []
    for profile in (False, True):
        params = _params()
        opt = AdamW(_groups(params), lr=1e-2)
        for i in range(3):
            for p, g in zip(params, _grads(i), strict=True):
                p.grad = g.clone()
            if profile:
                with torch.autograd.profiler.profile() as prof:
                    opt.step()
                assert any(e.name == "wavefront::adamw_" for e in prof.function_events)
            else:
                opt.step()
        results.append([p.detach() for p in params])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
