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
from wavefront.kernels.matmul_config import GEMM_TABLES, gemm_candidates, gemm_config, tma_capable, tma_config
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
    assert names == [("_linear_fwd_tma_kernel", None), ("_linear_bwd_tma_kernel", False)]
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
    with recording() as launches:
        y, g = kernels.linear_fwd(x, w, b, None, "gelu", True, arch=cpu, config=heavy, tma=False)
        y_plain, _ = kernels.linear_fwd(x, w, None, None, None, False, arch=cpu, config=light, tma=False)
        dx, dw, db = kernels.linear_bwd(dy, x, w, g, True, True, True, arch=cpu, config=heavy, tma=False)
    assert all("tma" not in launch.name for launch in launches)
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


# ---------------------------------------------------------------------------------------------------
# TMA persistent kernels (kernels/linear_tma.py) under the interpreter, and the vendor-BLAS provider rule.


def _bf16_problem(M, N, K, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen).bfloat16()
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).bfloat16()
    b = torch.randn(N, generator=gen).bfloat16()
    r = torch.randn(M, N, generator=gen).bfloat16()
    dy = torch.randn(M, N, generator=gen).bfloat16()
    return x, w, b, r, dy


def _max_rel(got, want):
    return float((got.double() - want).abs().max() / want.abs().max())


def test_tma_tiles_under_the_interpreter():
    """The Hopper TMA entries (persistent, warp-specialized; sm_100's have the same tile shapes) on 200 x 296 x 136
    (ragged against the tiles; rows 16-byte aligned for the descriptors): fwd with gelu, bias and residual, and
    dx, dW, db with the dz prologue; the weight also as a transposed view (B stored [K, N]: B_T). Each tensor
    within two bf16 ulps of the float64 result's largest magnitude."""
    arch = runtime.get_arch("sm_90")
    cpu = runtime.get_arch("cpu")
    x, w, b, r, dy = _bf16_problem(200, 296, 136)
    for weight in (w, w.t().contiguous().t()):
        with recording() as launches:
            y, g = kernels.linear_fwd(x, weight, b, r, "gelu", True, arch=cpu, tma=True,
                                      config=tma_config(200, 296, 136, torch.bfloat16, arch, "epilogue"))
            dx, dw, db = kernels.linear_bwd(dy, x, weight, g, True, True, True, arch=cpu, tma=True,
                                            config=tma_config(200, 136, 296, torch.bfloat16, arch, "prologue"))
        assert [launch.name for launch in launches] == ["_linear_fwd_tma_kernel"] + ["_linear_bwd_tma_kernel"] * 2
        assert launches[0].constexprs["W_T"] == (weight.stride(0) == 1)
        assert launches[2].constexprs["A_T"] and launches[2].constexprs["B_T"]  # dW reads dy^T and x^T in place
        x64, w64, b64, r64 = (t.double().requires_grad_() for t in (x, w, b, r))
        y_ref = reference.linear(x64, w64, b64, "gelu", r64)
        y_ref.backward(dy.double())
        eps = torch.finfo(torch.bfloat16).eps
        for got, want in ((y, y_ref.detach()), (dx, x64.grad), (dw, w64.grad), (db, b64.grad)):
            assert _max_rel(got, want) <= 2 * eps


def test_tma_and_pointer_paths_agree_and_fall_back():
    """Aligned operands take the TMA kernels, an unaligned row (K = 11: 22-byte rows) the pointer kernels; both
    paths give the same numbers where both apply; tma=True on an unaligned operand is refused."""
    x, w, b, r, dy = _bf16_problem(48, 40, 32)
    outs = {}
    for tma in (True, False):
        with recording() as launches:
            y, g = kernels.linear_fwd(x, w, b, r, "silu", True, tma=tma)
            grads = kernels.linear_bwd(dy, x, w, g, True, True, True, tma=tma)
        assert all(("tma" in launch.name) == tma for launch in launches)
        outs[tma] = (y, g, *grads)
    for a, c in zip(outs[True], outs[False], strict=True):
        assert _max_rel(a, c.double()) <= torch.finfo(torch.bfloat16).eps
    x11, w11, *_ = _bf16_problem(48, 40, 11)
    with recording() as launches:
        kernels.linear_fwd(x11, w11, None, None, None, False)
    assert [launch.name for launch in launches] == ["_linear_fwd_kernel"]
    with pytest.raises(ValueError, match="does not qualify for a tensor descriptor"):
        kernels.linear_fwd(x11, w11, None, None, None, False, tma=True)


@pytest.mark.parametrize("arch_name", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100", "cpu"])
def test_tma_configs(arch_name):
    arch = runtime.get_arch(arch_name)
    kinds = ("light", "residual", "epilogue", "prologue")
    if not tma_capable(arch):
        assert all(tma_config(8192, 4096, 4096, torch.bfloat16, arch, k) is None for k in kinds)
        return
    for kind in kinds:
        cfg = tma_config(8192, 4096, 4096, torch.bfloat16, arch, kind)
        assert cfg.warp_specialize and cfg.reason
        if arch.family == "nvidia":
            # Triton 3.9's Hopper warp specializer acts only with num_warps=4 (one producer + two consumers).
            assert cfg.num_warps == (4 if arch.name == "sm_90" else 8)
            assert cfg.BLOCK_M == 128 and cfg.BLOCK_N >= 128
            assert tma_config(16, 4096, 4096, torch.bfloat16, arch, kind) is None  # decode: pointer path
            assert tma_config(8192, 4096, 4096, torch.float32, arch, kind).BLOCK_K == cfg.BLOCK_K // 2


RULE = {  # (product, activation, bias, residual) -> provider on a GPU, from the stated rule
    ("fwd", False, False, False): "vendor", ("fwd", False, True, False): "vendor",
    ("fwd", False, False, True): "wavefront", ("fwd", True, False, False): "wavefront",
    ("dx", False, True, True): "vendor", ("dx", True, False, False): "wavefront",
    ("dw", False, False, True): "vendor", ("dw", False, True, False): "wavefront",
    ("dw", True, False, False): "wavefront",
}


@pytest.mark.parametrize("arch_name", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100", "cpu"])
def test_provider_rule(arch_name):
    from wavefront.kernels.matmul_config import gemm_provider

    arch = runtime.get_arch(arch_name)
    for (product, act, bias, res), want in RULE.items():
        choice = gemm_provider(product, arch, activation=act, bias=bias, residual=res)
        assert choice.provider == ("wavefront" if arch.family == "cpu" else want), (product, act, bias, res)
        assert len(choice.reason) > 20
    with pytest.raises(ValueError, match="gemm product"):
        gemm_provider("dq", arch, activation=False)


@pytest.mark.parametrize("target", ["sm_90", "gfx942"])
@pytest.mark.parametrize(("activation", "bias", "residual"),
                         [(None, False, False), (None, True, False), (None, False, True), ("gelu", True, False)])
def test_auto_dispatch_follows_the_rule(target, activation, bias, residual):
    """ops.linear on a GPU target (recorded, not run): our kernels exactly for the products the rule keeps;
    provider="wavefront" launches all of them, provider="vendor" none."""
    x, w, b, r, _ = (t.float() for t in _bf16_problem(64, 64, 32))  # every product has M >= 64 (TMA entries)
    kwargs = dict(activation=activation, residual=r if residual else None)
    want_fwd = activation is not None or residual
    want_dx = activation is not None
    want_dw = activation is not None or bias
    for provider, expect in (("auto", (want_fwd, want_dx, want_dw)), ("wavefront", (True, True, True)),
                             ("vendor", (False, False, False))):
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        with runtime.assume_target(target, 132), recording(execute=False) as launches:
            y = ops.linear(leaves[0], leaves[1], leaves[2] if bias else None, provider=provider, **kwargs)
            y.backward(torch.ones_like(y))
        names = [(launch.name.replace("_tma", ""), launch.constexprs.get("ROWSUM")) for launch in launches]
        expected = [name for name, on in ((("_linear_fwd_kernel", None), expect[0]),
                                          (("_linear_bwd_kernel", False), expect[1]),
                                          (("_linear_bwd_kernel", bias), expect[2])) if on]
        assert names == expected, (provider, names)
        assert all(("_tma" in launch.name) == (target == "sm_90") for launch in launches)
        assert all(t.grad is not None for t in leaves[: 3 if bias else 2])


@pytest.mark.parametrize("provider", ["vendor", "wavefront"])
def test_forced_providers_match_the_reference(provider):
    """Every product forced to one side, with an activation, bias and residual: fp32 against autograd of
    the float64 reference."""
    x, w, b, r = _leaves()
    dy = torch.randn(24, 40)
    with recording() as launches:
        ops.linear(x, w, b, activation="gelu_tanh", residual=r, provider=provider).backward(dy)
    assert (len(launches) == 0) == (provider == "vendor")
    x2, w2, b2 = (t.detach().double().requires_grad_() for t in (x, w, b))
    reference.linear(x2, w2, b2, "gelu_tanh", r.detach().double()).backward(dy.double())
    for ours, ref in ((x.grad, x2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="'provider' must be one of"):
        ops.linear(x, w, provider="cublas")


@pytest.mark.parametrize("activation", [None, "silu"])
def test_pretransposed_backward(monkeypatch, activation):
    """The AMD CDNA backward (PRETRANSPOSE_FAMILIES) through the interpreter: dx reads a contiguous W^T, dW a
    contiguous dz^T (formed in one pass) and x^T, so every operand's reduction dim is unit-stride; same numbers
    as the in-place transposed views, dbias included."""
    x, w, b, _, dy = _bf16_problem(40, 48, 24)
    y, g = kernels.linear_fwd(x, w, b, None, activation, activation is not None)
    want = kernels.linear_bwd(dy, x, w, g, True, True, True, tma=False)
    monkeypatch.setattr(kernels, "PRETRANSPOSE_FAMILIES", ("cpu",))
    with recording() as launches:
        got = kernels.linear_bwd(dy, x, w, g, True, True, True, tma=False)
    strides = [launch.args[:3] for launch in launches]
    for a, _g, bmat in strides:
        assert a.stride[1] == 1 and bmat.stride[1] == 1, strides  # reduction dim unit-stride for A and B
    assert launches[1].constexprs["SCALE_A"] is False  # dz^T was formed before the dW product
    for ours, ref in zip(got, want, strict=True):
        assert ours.dtype == ref.dtype == torch.bfloat16
        assert _max_rel(ours, ref.double()) <= torch.finfo(torch.bfloat16).eps


def test_split_k_under_the_interpreter():
    """Split-K through the TMA kernels (3 K slices over 13 k-steps: uneven slices) plus the reduction/epilogue
    kernel: fwd with gelu, bias, residual, and dx, dW, db, the same numbers as without splitting."""
    x, w, b, r, dy = _bf16_problem(40, 48, 200)
    outs = {}
    for splits in (1, 3):
        with recording() as launches:
            y, g = kernels.linear_fwd(x, w, b, r, "gelu", True, splits=splits)
            grads = kernels.linear_bwd(dy, x, w, g, True, True, True, splits=splits)
        # The forward's split form is its own kernel (no epilogue flags); the plain one takes no SPLIT_K.
        fwd = "_linear_fwd_tma_splitk_kernel" if splits > 1 else "_linear_fwd_tma_kernel"
        assert [launch.name for launch in launches if "_fwd_" in launch.name] == [fwd]
        assert all(launch.constexprs.get("SPLIT_K", 1) == splits for launch in launches)
        assert all("SPLIT_K" in launch.constexprs for launch in launches if launch.name != "_linear_fwd_tma_kernel")
        assert sum(launch.name == "_splitk_epilogue_kernel" for launch in launches) == (3 if splits > 1 else 0)
        outs[splits] = (y, g, *grads)
    for a, c in zip(outs[3], outs[1], strict=True):
        assert _max_rel(a, c.double()) <= torch.finfo(torch.bfloat16).eps


def test_split_k_rule():
    from wavefront.kernels.matmul_config import SPLIT_K_MAX, split_k

    cfg = tma_config(8192, 4096, 4096, torch.bfloat16, runtime.get_arch("sm_90"), "epilogue")
    assert split_k(8192, 4096, 4096, cfg, 132) == 1  # 2048 tiles fill the GPU
    assert split_k(256, 1024, 8192, cfg, 132) == 8  # 16 tiles, 128 k-steps: 8 slices of 16 k-steps
    assert split_k(256, 1024, 512, cfg, 132) == 1  # 8 k-steps: too short to split
    assert split_k(128, 128, 1 << 20, cfg, 132) == SPLIT_K_MAX



# ---------------------------------------------------------------------------------------------------
# Machine code of the new designs (compiled ahead of time in a subprocess without the interpreter).

_CODE_SCRIPT = r"""
import json, re, sys
import torch
from wavefront import runtime
from wavefront.kernels import linear
from wavefront.kernels._launch import recording
from wavefront.workbench.static.inspect import job_for
from wavefront.workbench.static.aot import compile_job

target = sys.argv[1]
bf16 = torch.bfloat16
x, w, b = torch.empty(4096, 1024, dtype=bf16), torch.empty(2048, 1024, dtype=bf16), torch.empty(2048, dtype=bf16)
r = torch.empty(4096, 2048, dtype=bf16)
with runtime.assume_target(target, 132 if target.startswith("sm") else 304), recording(execute=False) as rec:
    y, g = linear.linear_fwd(x, w, b, None, "gelu", True)
    linear.linear_fwd(x, w, None, r, None, False)
    linear.linear_bwd(y, x, w, g, True, True, True)
rows = []
for name, launch in zip(("fwd_gelu", "fwd_residual", "dx_prologue", "dw_prologue_bias"), rec):
    res = compile_job(job_for(launch, target, keep_asm=True))
    assert res.ok, res.error
    text = res.asm.get("ptx", "") + res.asm.get("sass", "") + res.asm.get("amdgcn", "")
    patterns = (("tma", r"cp\.async\.bulk\.tensor"), ("setmaxnreg", r"setmaxnreg"), ("ds_read_u16", r"ds_read_u16"),
                ("ds_write_b16", r"ds_write_b16"), ("ds_read_u8", r"ds_read_u8"))
    count = {k: len(re.findall(p, text)) for k, p in patterns}
    rows.append(dict(product=name, kernel=launch.name, spill=res.code.spill_bytes, shared=res.shared_bytes, **count))
print(json.dumps(rows))
"""


def _compiled(target: str) -> list[dict]:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _CODE_SCRIPT, target], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_100", "gfx90a", "gfx942"])
def test_machine_code(target):
    """sm_90/sm_100: every forward and backward product is the TMA kernel (bulk tensor copies) and warp-specialized
    (setmaxnreg), fits shared memory and spills nothing. gfx90a/gfx942: no narrow LDS access (the backward reads
    reduction-contiguous operands), no spills."""
    rows = _compiled(target)
    assert len(rows) == 4
    arch = runtime.get_arch(target)
    for row in rows:
        assert row["spill"] == 0 and row["shared"] <= arch.shared_mem_per_block, row
        if target.startswith("sm"):
            assert "tma" in row["kernel"] and row["tma"] > 0 and row["setmaxnreg"] > 0, row
        else:
            assert row["ds_read_u16"] == row["ds_write_b16"] == row["ds_read_u8"] == 0, row


def test_persistent_pointer_kernels(monkeypatch):
    """The AMD CDNA persistent grid (PERSISTENT_PRODUCTS) through the interpreter: 2 programs walk all the
    tiles of every product; same numbers as one program per tile. The grid rule: CUs x resident programs,
    backward products only on CDNA."""
    from wavefront.kernels import matmul_config
    from wavefront.kernels.matmul_config import persistent_programs

    x, w, b, r, dy = _bf16_problem(100, 72, 40)
    want_y, want_g = kernels.linear_fwd(x, w, b, r, "gelu", True, tma=False)
    want = kernels.linear_bwd(dy, x, w, want_g, True, True, True, tma=False)
    monkeypatch.setattr(matmul_config, "PERSISTENT_PRODUCTS", {"cpu": ("fwd", "bwd")})
    with recording() as launches:
        y, g = kernels.linear_fwd(x, w, b, r, "gelu", True, tma=False)
        got = kernels.linear_bwd(dy, x, w, g, True, True, True, tma=False)
    assert [(launch.grid, launch.constexprs["NUM_PROGRAMS"]) for launch in launches] == [((2,), 2)] * 3
    for ours, ref in zip((y, g, *got), (want_y, want_g, *want), strict=True):
        assert torch.equal(ours, ref)
    monkeypatch.undo()
    gfx942 = runtime.get_arch("gfx942")
    heavy = gemm_config(8192, 4096, 4096, torch.bfloat16, gfx942, heavy=True)  # 8 waves, waves_per_eu 2
    assert persistent_programs(2048, heavy, gfx942, 304) == 304  # one 8-wave program per CU, a multiple of 8 XCDs
    assert persistent_programs(2048, heavy, gfx942, 304, "fwd") == 0
    assert persistent_programs(200, heavy, gfx942, 304) == 0  # fewer tiles than CUs: one program per tile
    assert persistent_programs(2048, heavy, runtime.get_arch("sm_80"), 108) == 0
