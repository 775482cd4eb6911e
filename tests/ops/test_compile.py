"""Every registered op inside torch.compile(fullgraph=True), forward and backward, against eager.

The sweep iterates the registry (ops added later are covered without editing this file) with the
"aot_eager" backend: it runs dynamo capture, fake-tensor propagation through each custom op's fake
implementation and AOT autograd's joint graph, the parts that break; fullgraph=True turns any graph
break (a .item(), an untraceable check) into a failure. One test compiles a small chain of ops with the
default inductor backend.
"""

from __future__ import annotations

import pytest
import torch

from wavefront import ops
from wavefront.ops import REGISTRY


def _first_cases(spec, n=1):
    return [c for c in spec.cases if not c.slow][:n]


def _params():
    for spec in REGISTRY.values():
        for case in _first_cases(spec):
            yield pytest.param(spec, case, id=f"{spec.name}-{case.name}")


def _outputs(out):
    outs = out if isinstance(out, tuple | list) else (out,)
    return [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]


@pytest.mark.parametrize(("spec", "case"), list(_params()))
def test_registry_op_compiles_without_graph_breaks(spec, case):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    inputs = spec.make_inputs(case, torch.float32, torch.device("cpu"), gen)
    grad_args = inputs.grad_argnums if spec.has_backward else ()

    def fresh():
        return [a.detach().clone().requires_grad_(i in grad_args) if isinstance(a, torch.Tensor) else a
                for i, a in enumerate(inputs.args)]

    def fn(*args):
        return spec.fn(*args, **inputs.kwargs)

    eager_args, compiled_args = fresh(), fresh()
    eager_out = _outputs(fn(*eager_args))
    compiled_out = _outputs(torch.compile(fn, backend="aot_eager", fullgraph=True)(*compiled_args))
    assert len(compiled_out) == len(eager_out) > 0
    for c, e in zip(compiled_out, eager_out, strict=True):
        torch.testing.assert_close(c, e)
    if not grad_args:
        return
    dys = [torch.randn(o.shape, generator=gen) for o in eager_out]
    grads = {}
    for name, outs, args in (("eager", eager_out, eager_args), ("compiled", compiled_out, compiled_args)):
        diff = [(o, dy) for o, dy in zip(outs, dys, strict=True) if o.requires_grad]
        grads[name] = torch.autograd.grad([o for o, _ in diff], [args[i] for i in grad_args],
                                          [dy for _, dy in diff])
    for c, e in zip(grads["compiled"], grads["eager"], strict=True):
        torch.testing.assert_close(c, e)


def test_inductor_chain_of_ops():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 64, generator=gen)
    w_norm = torch.randn(64, generator=gen)
    w_gate, w_up = torch.randn(64, 128, generator=gen) * 0.1, torch.randn(64, 128, generator=gen) * 0.1
    w_head = torch.randn(50, 128, generator=gen) * 0.1
    target = torch.randint(0, 50, (2, 6), generator=gen)

    def model(x, w_norm, w_gate, w_up, w_head):
        h = ops.rms_norm(x, w_norm)
        a = ops.swiglu(h @ w_gate, h @ w_up)
        return ops.linear_cross_entropy(a, w_head, target, softcap=30.0) + ops.cross_entropy(a @ w_head.t(), target)

    def run(f):
        args = [t.clone().requires_grad_() for t in (x, w_norm, w_gate, w_up, w_head)]
        loss = f(*args)
        return loss, torch.autograd.grad(loss, args)

    eager_loss, eager_grads = run(model)
    compiled_loss, compiled_grads = run(torch.compile(model, fullgraph=True))
    torch.testing.assert_close(compiled_loss, eager_loss)
    for c, e in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5)


def test_cross_entropy_ignore_index_under_compile():
    # Liger PR #1338: a silently wrong fused loss with ignore_index under compile. Mean over the
    # non-ignored rows only, compiled or not.
    torch._dynamo.reset()
    logits = torch.randn(8, 40)
    target = torch.tensor([1, -100, 3, -100, 5, 6, -100, 7])
    f = torch.compile(lambda x: ops.cross_entropy(x, target), backend="aot_eager", fullgraph=True)
    expect = torch.nn.functional.cross_entropy(logits, target)
    torch.testing.assert_close(f(logits), expect)


def test_inplace_backward_is_ignored_under_compile():
    # The in-place gradient is an eager memory trick; compiled, the default path runs and the logits survive.
    torch._dynamo.reset()
    logits = torch.randn(6, 30)
    target = torch.randint(0, 30, (6,))
    x = logits.clone().requires_grad_()
    f = torch.compile(lambda x: ops.cross_entropy(x * 1.0, target, inplace_backward=True), backend="aot_eager",
                      fullgraph=True)
    f(x).backward()
    expect = logits.clone().requires_grad_()
    torch.nn.functional.cross_entropy(expect, target).backward()
    torch.testing.assert_close(x.grad, expect.grad)
    assert torch.equal(x.detach(), logits)
