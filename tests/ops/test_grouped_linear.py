"""grouped_linear beyond the registry sweep (tests/ops/test_accuracy.py runs every case in fp32/bf16/fp16):
each kernel path on the CPU (TMA descriptors, pointers, AMD's token-major dW copies), padding rows in dirty
memory, no host sync and compile fullgraph with the SwiGLU epilogue, input errors, the launch plans per
architecture, the torch._grouped_mm bench peer, and the machine code of the compiled kernels.

The machine-code checks compile ahead of time in a subprocess without TRITON_INTERPRET (as in
test_matrix_instructions.py):

    python tests/ops/test_grouped_linear.py --jobs sm_90:fwd_swiglu,sm_100:dw,gfx942:dx
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wavefront import ops, reference

PRODUCTS = ("fwd", "fwd_swiglu", "dx", "dw")
#: The matrix instruction each target's kernels must contain (HGMMA is wgmma, UTC*MMA tcgen05).
EXPECTED = {"sm_80": "HMMA", "sm_90": "HGMMA", "sm_100": "UTC", "gfx90a": "v_mfma", "gfx942": "v_mfma",
            "gfx1100": "v_wmma"}
TMA_TARGETS = ("sm_90", "sm_100")


# ---------------------------------------------------------------------------------------------------
# The compile side (runs in the subprocess).

def compile_products(jobs) -> list[dict]:
    """jobs: (target, product) pairs; one row per pair."""
    import torch

    from wavefront import runtime
    from wavefront.kernels import grouped_linear as kernels
    from wavefront.kernels._launch import recording
    from wavefront.workbench.static.aot import compile_job
    from wavefront.workbench.static.inspect import job_for

    bf16 = torch.bfloat16
    # 128 experts (Qwen3-MoE's count): the group search's table then has 256 entries.
    T, K, N, E = 1024, 512, 768, 128
    x, w, dz = torch.empty(T, K, dtype=bf16), torch.empty(E, N, K, dtype=bf16), torch.empty(T, N, dtype=bf16)
    offsets = torch.zeros(E, dtype=torch.int32)
    rows = []
    for target in dict.fromkeys(t for t, _ in jobs):
        products = [p for t, p in jobs if t == target]
        arch = runtime.get_arch(target)
        with runtime.assume_target(target, arch_sms(target)), recording(execute=False) as rec:
            kernels.grouped_linear_fwd(x, w, offsets, False, False, arch=arch)
            kernels.grouped_linear_fwd(x, w, offsets, True, True, arch=arch)
            kernels.grouped_linear_bwd(dz, x, w, offsets, True, True, arch=arch)
        gemms = [la for la in rec if la.name in GEMM_KERNELS]
        for name, launch in zip(PRODUCTS, gemms, strict=True):
            if name not in products:
                continue
            res = compile_job(job_for(launch, target))
            code = res.code
            c = launch.constexprs
            rows.append({"target": target, "product": name, "ok": res.ok, "error": res.error,
                         "tile": f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}", "num_warps": res.num_warps,
                         "tma": bool(c["USE_TMA"]), "warp_specialize": bool(c["WARP_SPECIALIZE"]),
                         "regs": code.regs if code else None, "spill_bytes": code.spill_bytes if code else None,
                         "shared_bytes": res.shared_bytes, "tma_ops": code.tma_ops if code else 0,
                         "setmaxnreg": code.setmaxnreg if code else 0,
                         "matrix_ops": sorted(code.matrix_ops) if code else [],
                         "narrow_lds_ops": code.narrow_lds_ops if code else 0,
                         "lds_read_widths": code.lds_read_widths if code else {}})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


#: The grouped products' kernels: the plain forward and dx, the SwiGLU forward, dW.
GEMM_KERNELS = ("_grouped_gemm_kernel", "_grouped_gemm_swiglu_kernel", "_grouped_dw_kernel")


def arch_sms(target: str) -> int:
    # The grids are recorded with each part's SM / CU count (H100 132, B200 148, MI300X 304).
    return {"sm_90": 132, "sm_100": 148, "gfx942": 304, "gfx90a": 110}.get(target, 108)


def _run(jobs) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, __file__, "--jobs", ",".join(f"{t}:{p}" for t, p in jobs)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _check_machine_code(row) -> None:
    from wavefront.runtime import get_arch

    assert row["ok"], row["error"]
    assert row["spill_bytes"] == 0, row
    assert row["shared_bytes"] <= get_arch(row["target"]).shared_mem_per_block, row
    assert any(op.startswith(EXPECTED[row["target"]]) for op in row["matrix_ops"]), row
    if row["target"] in TMA_TARGETS:
        assert row["tma"] and row["tma_ops"] > 0, row
    if row["target"].startswith("gfx9"):
        # MFMA operands reach LDS and leave it only by wide accesses: no ds_read_u16 / ds_write_b16.
        assert row["narrow_lds_ops"] == 0, row
        assert set(row["lds_read_widths"]) <= {"64", "128", 64, 128}, row


def test_machine_code():
    """Default suite, two compiles: the SwiGLU forward on sm_90 (wgmma, TMA, warp specialization, no spill) and
    AMD's dW, the product whose operands are token-major (MFMA with wide LDS traffic only)."""
    jobs = [("sm_90", "fwd_swiglu"), ("gfx942", "dw")]
    rows = _run(jobs)
    assert [(r["target"], r["product"]) for r in rows] == jobs
    for row in rows:
        _check_machine_code(row)
    assert rows[0]["warp_specialize"] and rows[0]["setmaxnreg"] > 0, rows[0]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100"])
def test_machine_code_every_product(target):
    rows = _run([(target, p) for p in PRODUCTS])
    assert len(rows) == len(PRODUCTS)
    for row in rows:
        _check_machine_code(row)
        if target in TMA_TARGETS:
            assert row["warp_specialize"] and row["setmaxnreg"] > 0, row


# ---------------------------------------------------------------------------------------------------
# The CPU side: numerics under the Triton interpreter.

def _spec():
    from wavefront.ops import REGISTRY

    return REGISTRY["grouped_linear"]


def _case(name):
    return next(c for c in _spec().cases if c.name == name)


def _inputs(name, dtype=None, seed=0):

    return _spec().make_inputs(_case(name), dtype or torch.float32, "cpu", torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("path", ["tma", "pointer", "token_major"])
def test_every_path_matches_reference(path, monkeypatch):
    """Each kernel path against the float64 reference (bf16, forward and backward, SwiGLU with empty groups),
    and the launches show that the path asked for ran: TMA descriptors (the CPU default, which the registry
    sweep runs in every case), pointer loads, or AMD's token-major dW copies padded to whole token blocks."""
    case = "swiglu_empty"

    from wavefront.kernels import grouped_config
    from wavefront.kernels import grouped_linear as kernels
    from wavefront.kernels._launch import recording
    from wavefront.workbench.bench.correctness import check_case

    if path != "tma":
        monkeypatch.setattr(kernels, "_tma_ok", lambda *tensors: False)
    if path == "token_major":
        monkeypatch.setattr(grouped_config, "PRETRANSPOSE_FAMILIES", ("cpu",))
    with recording() as launches:
        result = check_case(_spec(), _case(case), torch.bfloat16)
    assert result.error is None, result.error
    assert {c.mode for c in result.checks} == {"fwd", "bwd"}
    assert result.passed, [c for c in result.checks if not c.passed]
    gemms = [la for la in launches if la.name in GEMM_KERNELS]
    assert {la.constexprs["USE_TMA"] for la in gemms} == {path == "tma"}
    dw = [la for la in gemms if la.name == "_grouped_dw_kernel"]
    assert dw and {la.constexprs["ALIGNED_TOKENS"] for la in dw} == {path == "token_major"}


def test_padding_rows_are_zero_in_dirty_memory(monkeypatch):
    """Rows past offsets[-1] come out zero and get zero dx even when every fresh buffer starts as NaN and the
    padding rows of x are NaN; dW only sees routed rows. (A fresh CPU allocation is usually zero already.)
    SwiGLU: the forward also writes the saved pre-activation and the backward the SwiGLU gradient there."""


    x, weight, offsets = _inputs("swiglu").args
    routed = int(offsets[-1])
    assert routed < x.shape[0]
    x = x.clone()
    x[routed:] = float("nan")
    real_empty = torch.empty

    def dirty_empty(*shape, **kwargs):
        t = real_empty(*shape, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()
    monkeypatch.setattr(torch, "empty", dirty_empty)
    y = ops.grouped_linear(xg, wg, offsets, activation="swiglu")
    y.backward(torch.ones_like(y))
    monkeypatch.setattr(torch, "empty", real_empty)
    assert torch.equal(y[routed:], torch.zeros_like(y[routed:]))
    assert torch.equal(xg.grad[routed:], torch.zeros_like(xg.grad[routed:]))
    xr, wr = x[:routed].double().requires_grad_(), weight.double().requires_grad_()
    ref = reference.grouped_linear(xr, wr, offsets, "swiglu")
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(y[:routed].double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wg.grad.double(), wr.grad, rtol=1e-5, atol=1e-5)


def test_empty_groups_get_zero_weight_gradient():


    x, weight, offsets = _inputs("empty_groups").args
    sizes = torch.diff(offsets, prepend=offsets.new_zeros(1))
    empty = (sizes == 0).nonzero().flatten().tolist()
    assert len(empty) >= 2
    weight = weight.clone().requires_grad_()
    ops.grouped_linear(x, weight, offsets).square().sum().backward()
    for e in empty:
        assert torch.equal(weight.grad[e], torch.zeros_like(weight.grad[e]))
    assert all(weight.grad[e].abs().sum() > 0 for e in range(weight.shape[0]) if e not in empty)


def test_swiglu_makes_no_host_sync():
    """The registry-wide test (test_no_host_sync.py) runs the first case, without an activation; this one runs
    the SwiGLU epilogue and its backward."""
    from _host_sync import host_syncs


    x, weight, offsets = _inputs("swiglu").args
    x, weight = x.requires_grad_(), weight.requires_grad_()
    with host_syncs() as calls:
        ops.grouped_linear(x, weight, offsets, activation="swiglu").sum().backward()
    assert calls == []
    assert x.grad is not None and weight.grad is not None


@pytest.mark.slow
def test_swiglu_compiles_fullgraph():
    """test_compile.py compiles the registry's first case (no activation); this one the SwiGLU epilogue."""


    torch._dynamo.reset()
    x, weight, offsets = _inputs("swiglu_empty").args

    def fn(x, w):
        return ops.grouped_linear(x, w, offsets, activation="swiglu")

    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()
        y = f(xg, wg)
        y.backward(torch.ones_like(y))
        results.append((y, xg.grad, wg.grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("change", "match"), [
    (lambda x, w, o: (x[:, :-1], w, o), r"x.shape\[1\].*weight.shape\[2\]"),
    (lambda x, w, o: (x, w[0], o), r"'weight' must have 3 dims"),
    (lambda x, w, o: (x, w, o.float()), r"'offsets' must have dtype"),
    (lambda x, w, o: (x, w, o[:-1]), r"'offsets' must have shape \(4,\)"),
    (lambda x, w, o: (x, w.double(), o), r"'weight' must have the dtype of 'x'"),
    (lambda x, w, o: (x, w[:, :-1], o), r"even weight.shape\[1\]"),
])
def test_bad_inputs_name_the_argument(change, match):


    x, weight, offsets = change(*_inputs("swiglu").args)
    with pytest.raises((ValueError, TypeError), match=match):
        ops.grouped_linear(x, weight, offsets, activation="swiglu")
    with pytest.raises(ValueError, match="'activation' must be one of"):
        ops.grouped_linear(*_inputs("swiglu").args, activation="gelu")


def test_plans_per_architecture():
    """TMA + warp specialization for every product on sm_90 and sm_100, pointer kernels with token-major dW /
    transposed-W dx copies on CDNA, plain pointer kernels on sm_80, unaligned operands on pointers everywhere,
    fp32 halving BLOCK_K."""
    from wavefront.kernels.grouped_config import grouped_plan
    from wavefront.runtime import get_arch

    def plan(product, target, tma_ok=True, dtype=torch.bfloat16):
        return grouped_plan(product, 4096, 4096, 4096, dtype, get_arch(target), "cpu", tma_ok)

    for product in PRODUCTS:
        for target in TMA_TARGETS:
            p = plan(product, target)
            assert p.use_tma and p.config.warp_specialize and p.programs > 0 and not p.pretranspose
    assert not plan("fwd", "sm_90", tma_ok=False).use_tma
    assert [plan(p, "gfx942").pretranspose for p in PRODUCTS] == [False, False, True, True]
    assert not any(plan(p, "gfx942").use_tma or plan(p, "sm_80").use_tma for p in PRODUCTS)
    assert plan("fwd", "gfx942").config.options(get_arch("gfx942"))["matrix_instr_nonkdim"] == 16
    assert plan("fwd", "sm_90", dtype=torch.float32).config.BLOCK_K == plan("fwd", "sm_90").config.BLOCK_K // 2
    with pytest.raises(ValueError, match="product must be one of"):
        plan("dy", "sm_90")


def test_grouped_mm_bench_peer():
    """The bench's torch._grouped_mm provider computes the op's forward (SwiGLU as PyTorch ops, padding rows
    zeroed) and serves grouped_linear only."""
    from wavefront.ops import REGISTRY
    from wavefront.workbench.bench.providers import ProviderSet, Unavailable

    providers = ProviderSet(torch.device("cpu"))
    assert isinstance(providers.resolve("grouped_mm", REGISTRY["linear"]), Unavailable)
    peer = providers.resolve("grouped_mm", _spec())
    if isinstance(peer, Unavailable):
        pytest.skip(peer.reason)
    x, weight, offsets = _inputs("swiglu").args
    for activation in (None, "swiglu"):
        want = reference.grouped_linear(x.double(), weight.double(), offsets, activation)
        torch.testing.assert_close(peer(x, weight, offsets, activation=activation).double(), want, rtol=1e-5,
                                   atol=1e-5)


def test_flops_and_bytes_follow_the_routed_rows():

    spec = _spec()
    case = _case("padding")
    T, K, N, E, pad = (case.dims[k] for k in ("T", "K", "N", "E", "pad"))
    assert spec.flops(case, "fwd") == 2 * (T - pad) * N * K
    assert spec.flops(case, "bwd") == 2 * spec.flops(case, "fwd")
    assert spec.min_bytes(case, torch.bfloat16, "fwd") == 2 * (T * K + E * N * K + T * N) + 8 * E
    mixtral = next(c for c in spec.bench_cases if c.name == "mixtral-8x7b_gate_up")
    assert (mixtral.dims["T"], mixtral.dims["N"], mixtral.dims["K"], mixtral.dims["E"]) == (16384, 28672, 4096, 8)
    assert math.isclose(spec.flops(mixtral, "fwd"), 2 * 16384 * 28672 * 4096)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(f"{t}:{p}" for t in ("sm_90", "sm_100", "gfx942") for p in PRODUCTS),
                        help="comma-separated target:product pairs")
    ns = parser.parse_args()
    print(json.dumps(compile_products([tuple(job.split(":")) for job in ns.jobs.split(",")])))
