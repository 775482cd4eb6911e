"""wavefront.ops.linear beyond the registry's accuracy cases: every activation x bias x residual
combination against the float64 reference under the accuracy rule, which gradients are computed, the
GPU tile shapes through the interpreter, program order, the configuration tables, the module form,
torch.compile, and bad input."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import triton
import triton.language as tl

from wavefront import nn as wnn
from wavefront import ops, reference, runtime
from wavefront.kernels import linear as kernels
from wavefront.kernels._launch import launch, recording
from wavefront.kernels._program_order import grouped_tile, xcd_remap
from wavefront.kernels.matmul_config import GEMM_TABLES, gemm_candidates, gemm_config
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case
from wavefront.workbench.bench.correctness import check_case

SPEC = REGISTRY["linear"]


@pytest.mark.parametrize(("activation", "bias", "residual"),
                         list(itertools.product([None, "relu", "gelu", "gelu_tanh", "silu"], [False, True],
                                                [False, True])))
def test_every_epilogue_combination(activation, bias, residual):
    """fwd and bwd (dx, dweight, dbias) vs float64, bf16, ragged 37 x 45 x 29 (tiles 32x32x16)."""
    case = Case("combo", "combination", {"M": 37, "N": 45, "K": 29},
                {"activation": activation, "bias": bias, "residual": residual})
    result = check_case(SPEC, case, torch.bfloat16)
    assert result.error is None, result.error
    assert len([c for c in result.checks if c.mode == "bwd"]) == (3 if bias else 2)
    failed = [c for c in result.checks if not c.passed]
    assert not failed, [(c.what, c.err_ours, c.bound) for c in failed]


def _leaves(M=24, N=40, K=32, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen).to(dtype).requires_grad_()
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype).requires_grad_()
    b = torch.randn(N, generator=gen).to(dtype).requires_grad_()
    r = torch.randn(M, N, generator=gen).to(dtype).requires_grad_()
    return x, w, b, r


def test_residual_gradient_is_dy():
    x, w, b, r = _leaves()
    dy = torch.randn(24, 40)
    ops.linear(x, w, b, activation="gelu", residual=r).backward(dy)
    assert torch.equal(r.grad, dy)


def test_gradients_match_autograd_of_the_reference():
    x, w, b, r = _leaves()
    dy = torch.randn(24, 40)
    ops.linear(x, w, b, activation="silu", residual=r).backward(dy)
    x2, w2, b2, r2 = (t.detach().double().requires_grad_() for t in (x, w, b, r))
    reference.linear(x2, w2, b2, "silu", r2).backward(dy.double())
    for ours, ref in ((x.grad, x2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-5)


def test_only_the_needed_products_run():
    """A frozen weight skips the dW/db product; no grad at all saves no act'(z)."""
    x, w, b, _ = _leaves()
    w.requires_grad_(False)
    b.requires_grad_(False)
    with recording() as launches:
        ops.linear(x, w, b, activation="gelu").sum().backward()
    names = [(launch.name, launch.constexprs.get("ROWSUM")) for launch in launches]
    assert names == [("_linear_fwd_kernel", None), ("_linear_bwd_kernel", False)]
    assert launches[0].constexprs["SAVE_GRAD"] is True
    assert w.grad is None
    with torch.no_grad(), recording() as launches:
        ops.linear(x, w, b, activation="gelu")
    assert launches[0].constexprs["SAVE_GRAD"] is False
    x.requires_grad_(False)
    w.requires_grad_(False)
    b.requires_grad_(True)
    with recording() as launches:
        ops.linear(x, w, b, activation="relu").sum().backward()
    assert [launch.constexprs.get("ROWSUM") for launch in launches[1:]] == [True]
    want = (x @ w.t() + b.detach() > 0).sum(0).to(b.dtype)
    torch.testing.assert_close(b.grad, want)


@pytest.mark.parametrize("arch_name", ["sm_90", "gfx942"])
def test_gpu_tile_shapes_under_the_interpreter(arch_name):
    """The NVIDIA and AMD large-M tiles (128x256 light, 128x128 heavy; 256x256 on MI300X), through the
    interpreter on a 300 x 260 x 100 problem (ragged everywhere)."""
    arch = runtime.get_arch(arch_name)
    cpu = runtime.get_arch("cpu")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(300, 100, generator=gen).bfloat16()
    w = (torch.randn(260, 100, generator=gen) * 0.1).bfloat16()
    b = torch.randn(260, generator=gen).bfloat16()
    dy = torch.randn(300, 260, generator=gen).bfloat16()
    light = dataclasses.replace(gemm_config(300, 260, 100, torch.bfloat16, arch), waves_per_eu=0,
                                matrix_instr_nonkdim=0, kpack=1)
    heavy = dataclasses.replace(gemm_config(300, 260, 100, torch.bfloat16, arch, heavy=True), waves_per_eu=0,
                                matrix_instr_nonkdim=0, kpack=1)
    y, g = kernels.linear_fwd(x, w, b, None, "gelu", True, arch=cpu, config=heavy)
    y_plain, _ = kernels.linear_fwd(x, w, None, None, None, False, arch=cpu, config=light)
    dx, dw, db = kernels.linear_bwd(dy, x, w, g, True, True, True, arch=cpu, config=heavy)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    y_ref = reference.linear(x64, w64, b64, "gelu")
    y_ref.backward(dy.double())
    eps = torch.finfo(torch.bfloat16).eps
    pairs = ((y, y_ref.detach()), (y_plain, (x64 @ w64.t()).detach()), (dx, x64.grad), (dw, w64.grad),
             (db, b64.grad))
    for got, want in pairs:
        # Two ulps of the largest magnitude: the output rounding, and dz rounded for the matrix unit.
        assert float((got.double() - want).abs().max()) <= 2 * eps * float(want.abs().max())


@triton.jit
def _order_kernel(tile_ptr, logical_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr):
    pid = xcd_remap(tl.program_id(0), num_pid_m * num_pid_n, NUM_XCDS)
    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)
    tl.store(tile_ptr + tl.program_id(0), pid_m * num_pid_n + pid_n)
    tl.store(logical_ptr + tl.program_id(0), pid)


def test_program_order_is_a_permutation():
    """xcd_remap and grouped ordering visit every tile exactly once, for awkward counts too."""
    for m, n, group, xcds in ((7, 5, 3, 8), (4, 4, 8, 8), (1, 9, 4, 8), (13, 2, 2, 1), (3, 3, 1, 8)):
        tiles = torch.full((m * n,), -1, dtype=torch.int32)
        logical = torch.full((m * n,), -1, dtype=torch.int32)
        launch(_order_kernel, (m * n,), tiles, logical, m, n, constexprs=dict(GROUP_M=group, NUM_XCDS=xcds),
               options={})
        assert sorted(tiles.tolist()) == list(range(m * n)), (m, n, group, xcds)
        assert sorted(logical.tolist()) == list(range(m * n)), (m, n, group, xcds)
        for xcd in range(min(xcds, m * n)):
            # XCD x runs programs x, x + 8, ...: they get one contiguous run of logical ids.
            mine = logical[xcd::xcds].tolist()
            assert mine == list(range(mine[0], mine[0] + len(mine))), (m, n, xcd)


@pytest.mark.parametrize("arch_name", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100", "cpu"])
def test_gemm_configs(arch_name):
    arch = runtime.get_arch(arch_name)
    for M in (1, 17, 100, 300, 8192):
        for heavy in (False, True):
            cands = gemm_candidates(M, 4096, 4096, torch.bfloat16, arch, heavy=heavy)
            assert 1 <= len(cands) <= 4
            cfg = cands[0]
            assert cfg.reason and min(cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K) >= 16
            if M >= 256 and arch.family != "cpu":
                assert cfg.BLOCK_M >= 128, "large problems get large tiles"
            wide = gemm_config(M, 4096, 4096, torch.float32, arch, heavy=heavy)
            if arch.family != "cpu":
                assert wide.BLOCK_K * 4 <= cfg.BLOCK_K * 2 or wide.BLOCK_K == 16
            opts = cfg.options(arch)
            assert ("waves_per_eu" in opts) == arch.family.startswith("amd")
            assert ("kpack" in opts) == (arch.family == "amd-cdna")
    assert all(e.reason for kinds in GEMM_TABLES.values() for entries in kinds.values() for _, e in entries)
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        gemm_config(0, 4, 4, torch.bfloat16, arch)


def test_module_form():
    torch.manual_seed(0)
    plain = torch.nn.Linear(32, 48)
    fused = wnn.Linear(32, 48, activation="gelu_tanh")
    fused.load_state_dict(plain.state_dict())
    assert set(fused.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 5, 32)
    r = torch.randn(2, 5, 48)
    want = reference.linear(x, plain.weight, plain.bias, "gelu_tanh", r)
    torch.testing.assert_close(fused(x, residual=r), want, rtol=1e-5, atol=1e-5)
    assert "activation='gelu_tanh'" in repr(fused)
    with pytest.raises(ValueError, match="'activation' must be one of"):
        wnn.Linear(4, 4, activation="tanh")


def test_torch_compile_fullgraph():
    x, w, b, r = _leaves(dtype=torch.bfloat16)

    def f(x, w, b, r):
        return ops.linear(x, w, b, activation="silu", residual=r).float().square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    eager_args = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
    comp_args = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
    f(*eager_args).backward()
    compiled(*comp_args).backward()
    for a, c in zip(eager_args, comp_args, strict=True):
        assert torch.equal(a.grad, c.grad)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"weight": torch.zeros(40, 31)}, ValueError, r"last dim of 'x' \(32\) must equal weight.shape\[1\]"),
    ({"weight": torch.zeros(40)}, ValueError, "'weight' must have 2 dims"),
    ({"bias": torch.zeros(39)}, ValueError, r"'bias' must have shape \(40,\)"),
    ({"residual": torch.zeros(24, 39)}, ValueError, r"'residual' must have the output's shape \(24, 40\)"),
    ({"activation": "tanh"}, ValueError, "'activation' must be one of"),
    ({"bias": torch.zeros(40, dtype=torch.float16)}, TypeError, "'bias' must have the dtype of 'x'"),
    ({"x": torch.zeros(24, 32, dtype=torch.int64)}, TypeError, "'x' must have dtype in"),
    ({"weight": torch.zeros(40, 32, device="meta")}, ValueError, "one device"),
])
def test_bad_input(kwargs, exc, match):
    args = {"x": torch.zeros(24, 32), "weight": torch.zeros(40, 32), "bias": None, "activation": None,
            "residual": None}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        ops.linear(args["x"], args["weight"], args["bias"], activation=args["activation"], residual=args["residual"])


def test_empty_and_fp64_use_the_reference():
    x = torch.zeros(0, 8)
    w = torch.randn(5, 8)
    assert ops.linear(x, w).shape == (0, 5)
    x64 = torch.randn(3, 8, dtype=torch.float64)
    w64 = torch.randn(5, 8, dtype=torch.float64)
    assert torch.equal(ops.linear(x64, w64, activation="relu"), reference.linear(x64, w64, None, "relu"))


@pytest.mark.slow
def test_torch_compile_inductor():
    x, w, b, r = _leaves()

    def f(x, w, b, r):
        return ops.linear(x, w, b, activation="gelu", residual=r).square().sum()

    eager_args = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
    comp_args = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
    f(*eager_args).backward()
    torch.compile(f, fullgraph=True)(*comp_args).backward()
    for a, c in zip(eager_args, comp_args, strict=True):
        torch.testing.assert_close(a.grad, c.grad, rtol=1e-6, atol=1e-6)
