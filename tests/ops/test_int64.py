"""64-bit addressing: row offsets past 2^31 elements.

The unit tests place small operands at element offsets beyond 2^31 inside a large buffer that is
allocated but never touched (the OS maps only the pages the test writes, so the process stays small),
then run each kernel on those views. int32 offset arithmetic would wrap, read or write the wrong memory
and, under the interpreter, often crash the process, so the checks run in a subprocess; a control run of
a deliberately int32 kernel shows the harness catches the bug. The real large case (a contiguous tensor
of more than 2^31 elements) is marked slow and needs a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

_PRELUDE = textwrap.dedent("""
    import json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.nn.functional as F
    ROW = 2**30 + 64          # fits int32; row 2 starts at 2^31 + 128 elements
    big = lambda n, dtype: torch.empty(n, dtype=dtype)   # virtual: pages appear only where written
    def strided_rows(n_rows, n_cols, dtype, seed):
        buf = big(ROW * (n_rows - 1) + n_cols, dtype)
        view = buf.as_strided((n_rows, n_cols), (ROW, 1))
        gen = torch.Generator().manual_seed(seed)
        view.copy_(torch.randn(n_rows, n_cols, generator=gen).to(dtype))
        return view
    out = {}
""")

_CHECKS = textwrap.dedent("""
    from wavefront import ops
    from wavefront.kernels import adamw as adamw_kernels
    from wavefront.ops.adamw import step_scalars as adamw_step_scalars
    from wavefront.kernels._launch import launch
    import triton.language as tl

    # cross_entropy: forward and backward read rows past 2^31; the in-place mode also writes there.
    x = strided_rows(3, 1000, torch.float32, 0)
    t = torch.tensor([5, 999, 0])
    xs = x.clone().requires_grad_()
    ref = F.cross_entropy(xs, t)
    ref.backward()
    xv = x.requires_grad_()
    loss = ops.cross_entropy(xv, t)
    loss.backward()
    out["ce_loss"] = float((loss - ref).abs())
    out["ce_grad"] = float((xv.grad - xs.grad).abs().max())
    xi = strided_rows(3, 1000, torch.float32, 0)
    inner = xi.requires_grad_()
    ops.cross_entropy(inner * 1.0, t).backward()
    out["ce_inplace_grad"] = float((inner.grad - xs.grad).abs().max())

    # swiglu: gate and up rows past 2^31, forward and backward.
    g = strided_rows(3, 700, torch.bfloat16, 1).requires_grad_()
    u = strided_rows(3, 700, torch.bfloat16, 2).requires_grad_()
    gc, uc = g.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    y = ops.swiglu(g, u)
    yc = ops.swiglu(gc, uc)
    y.float().sum().backward()
    yc.float().sum().backward()
    out["glu_fwd"] = float((y.float() - yc.float()).abs().max())
    out["glu_bwd"] = float((g.grad.float() - gc.grad.float()).abs().max())

    # rope: q [1, heads, 3, 64] whose sequence stride is ROW (positions past 2^31 elements).
    heads, d = 2, 64
    qbuf = big(ROW * 2 + heads * d, torch.float32)
    q = qbuf.as_strided((1, heads, 3, d), (0, d, ROW, 1))
    q.copy_(torch.randn(1, heads, 3, d))
    cos, sin = torch.randn(3, d), torch.randn(3, d)
    q_out, _ = ops.rope(q, None, cos, sin)
    q_ref, _ = ops.rope(q.contiguous(), None, cos, sin)
    out["rope"] = float((q_out - q_ref).abs().max())
    # rope: heads ROW apart (a [B, H, S, D] tensor of 2^31+ elements per batch entry): h * stride_h.
    qbuf = big(ROW * 2 + 3 * d, torch.float32)
    q = qbuf.as_strided((1, 3, 1, d), (0, ROW, d, 1))
    q.copy_(torch.randn(1, 3, 1, d))
    cos, sin = torch.randn(1, d), torch.randn(1, d)
    q_out, _ = ops.rope(q, None, cos, sin)
    q_ref, _ = ops.rope(q.contiguous(), None, cos, sin)
    out["rope_heads"] = float((q_out.contiguous() - q_ref).abs().max())

    # adamw: a whole block ending at 2^31 and a masked tail block past it, in 2^31 + 5000-element tensors.
    from wavefront.reference import adamw_update_
    n = 2**31 + 5000
    tensors = [big(n, torch.float32) for _ in range(4)]
    spans = [(2**31 - 2048, 2**31), (2**31 + 4096, n)]
    for k, tns in enumerate(tensors):
        for a, b in spans:
            tns[a:b] = torch.rand(b - a) * (0.01 if k == 3 else 1.0)
    expect = [[tns[a:b].clone() for tns in tensors] for a, b in spans]
    scal = adamw_step_scalars(1e-2, 0.9, 0.999, 1e-8, 0.01, 3.0)
    ptrs = torch.tensor([[tns.data_ptr() for tns in tensors] + [0, 0]], dtype=torch.int64)
    for a, _ in spans:
        # One program whose block is a // 2048: the tensor's first block sits that far before program 0.
        launch(adamw_kernels._adamw_kernel, (1,), ptrs_ptr=ptrs, numels_ptr=torch.tensor([n]),
               block_offsets_ptr=torch.tensor([-(a // 2048), 1]),
               scalars_ptr=torch.tensor([list(scal)], dtype=torch.float64), stride_scalars_row=7, n_tensors=1,
               search_steps=0,
               constexprs=dict(P_DTYPE=tl.float32, G_DTYPE=tl.float32, S_DTYPE=tl.float32, HAS_MASTER=False,
                               AMSGRAD=False, MAXIMIZE=False, ALIGNED=True, BLOCK=2048, ACC=tl.float32),
               options={"num_warps": 4})
    err = 0.0
    for (a, b), (p, gr, m, v) in zip(spans, expect):
        adamw_update_(p, gr, m, v, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=3.0)
        err = max(err, float((tensors[0][a:b] - p).abs().max()))
    out["adamw"] = err
    print(json.dumps(out))
""")

_CONTROL = textwrap.dedent("""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_rows_int32(x_ptr, y_ptr, stride_row, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # int32 row times an int32 stride: wraps past 2^31
        cols = tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride_row + cols, mask=cols < n_cols)
        tl.store(y_ptr + row * n_cols + cols, v, mask=cols < n_cols)

    x = strided_rows(3, 64, torch.float32, 0)
    y = torch.empty(3, 64)
    copy_rows_int32[(3,)](x, y, ROW, 64, BLOCK=64)
    out["control_err"] = float((y - x).abs().nan_to_num(1e30).max())
    print(json.dumps(out))
""")


def _run(script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", _PRELUDE + script], env=env, capture_output=True, text=True,
                          timeout=600)


def test_offsets_past_2_pow_31_in_every_kernel():
    res = _run(_CHECKS)
    assert res.returncode == 0, f"the subprocess died (int32 offsets?):\n{res.stderr[-3000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["ce_loss"] < 1e-5 and out["ce_grad"] < 1e-6 and out["ce_inplace_grad"] < 1e-6, out
    assert out["glu_fwd"] == 0.0 and out["glu_bwd"] == 0.0, out
    assert out["rope"] == 0.0 and out["rope_heads"] == 0.0, out
    assert out["adamw"] < 1e-6, out


def test_control_int32_kernel_is_caught():
    # Either the interpreter reads unmapped memory and the process dies, or the copy is wrong.
    res = _run(_CONTROL)
    caught = res.returncode != 0 or json.loads(res.stdout.strip().splitlines()[-1])["control_err"] > 0.0
    assert caught, "an int32 offset kernel went unnoticed: the harness cannot fail"


@pytest.mark.slow
def test_real_tensor_with_more_than_2_pow_31_elements():
    # A contiguous [16400, 131072] bf16 logits tensor (2.15e9 elements, 4.3 GB) through cross_entropy,
    # forward and backward. Under the CPU interpreter this takes ~30 minutes, so it runs on a GPU only.
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU: ~9 GB and ~30 min under the CPU interpreter")
    from wavefront import ops

    n_rows, vocab = 16400, 131072
    assert n_rows * vocab > 2**31
    logits = torch.randn(n_rows, vocab, device="cuda", dtype=torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (n_rows,), device="cuda")
    loss = ops.cross_entropy(logits, target, reduction="none")
    tail = slice(n_rows - 4, n_rows)  # rows whose offsets are past 2^31
    expect = torch.nn.functional.cross_entropy(logits[tail].float(), target[tail], reduction="none")
    torch.testing.assert_close(loss[tail], expect, rtol=1e-5, atol=1e-5)
    loss.sum().backward()
    probs = torch.softmax(logits[tail].float(), -1)
    probs[torch.arange(4), target[tail]] -= 1
    torch.testing.assert_close(logits.grad[tail].float(), probs, rtol=0, atol=1e-2)
