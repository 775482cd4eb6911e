"""Machine-code proof for the FP8 GEMM: compiled ahead of time at the launches the FP8 linear makes, the
kernel must run on the targets' FP8 matrix instructions and spill nothing:

    sm_90   QGMMA ... E4M3.E4M3 (wgmma with e4m3 operands; HGMMA is the 16-bit form)
    sm_100  UTCQMMA (tcgen05.mma kind::f8f6f4); the MXFP8 GEMM (tl.dot_scaled) must be the block-scaled form,
            PTX tcgen05.mma ... kind::mxf8f6f4.block_scale, whose UTCQMMA takes the two scale operands from
            tensor memory (three tmem[] operands; the unscaled form has two), and no other MMA
    gfx942  v_mfma_f32_*_fp8_fp8 (MFMA on the FNUZ e4m3 format, the only FP8 MI300's matrix units take)

The quantize kernels (no matrix unit) must not spill either. Like test_matrix_instructions.py (whose
compile and parse helpers this reuses), each target compiles in a subprocess without TRITON_INTERPRET:

    python tests/ops/test_fp8_machine_code.py --targets sm_90,gfx942 [--kernels gemm_rowwise,...]

The TMA kernels (``_fp8_gemm_tma_kernel``, ``_fp8_block_gemm_tma_kernel``, ``_mx_gemm_tma_kernel``: one per
scale form, opt-in with ``WAVEFRONT_FP8_TMA=1``), every recipe on sm_90 and sm_100: its operand loads (UTMALDG)
sit inside a loop (the producer's: in a warp-specialized kernel that loop holds no matrix instruction), it is
warp-specialized (USETMAXREG), issues no cp.async (LDGSTS) but for sm_100's MX scales, and the MXFP8 product is
the block-scaled MMA; the default cp.async kernels issue LDGSTS and no TMA.

All under ``-m slow`` (compiles take 10-20 s each on two cores): the rowwise GEMM on gfx942 alone, and
every kernel on sm_90, sm_100 and gfx942.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TARGETS = ("sm_90", "sm_100", "gfx942")
MXFP8 = ("gemm_mxfp8", "gemm_mxfp8_epilogue", "gemm_mxfp8_ragged")
#: The persistent, warp-specialized TMA kernel (WAVEFRONT_FP8_TMA=1), every recipe; sm_90 and sm_100 only.
TMA = ("tma_tensorwise", "tma_rowwise", "tma_blockwise", "tma_blockwise_dw", "tma_mxfp8")
#: The TMA kernels, one per scale form.
TMA_KERNELS = ("_fp8_gemm_tma_kernel", "_fp8_block_gemm_tma_kernel", "_mx_gemm_tma_kernel")
KERNELS = ("gemm_rowwise", "gemm_blockwise", "gemm_blockwise_dw", *MXFP8, "quantize_rowwise",
           "quantize_block128x128", *TMA)
#: The FP8 matrix instruction of each target, as the disassembly spells it.
EXPECTED = {"sm_90": r"QGMMA\.\S*E4M3\.E4M3", "sm_100": r"UTCQMMA", "gfx942": r"v_mfma_f32_\w+_fp8_fp8"}
#: sm_100's block-scaled MMA: in PTX, and in SASS as UTCQMMA with scale operands in tensor memory.
MX_PTX = r"tcgen05\.mma\.\S*kind::mxf8f6f4\.block_scale\S*"
MX_SASS = r"UTCQMMA\S*\s+gdesc\[\w+\],\s*gdesc\[\w+\],\s*tmem\[\w+\],\s*tmem\[\w+\],\s*idesc\[\w+\],\s*tmem\[\w+\]"


def _record(target: str):
    import torch

    from wavefront.kernels import linear_fp8, quantize
    from wavefront.kernels._launch import recording
    from wavefront.runtime import get_arch

    arch = get_arch(target)
    e4m3 = torch.float8_e4m3fnuz if target.startswith("gfx") else torch.float8_e4m3fn
    M, N, K = 512, 384, 1024
    x, w = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
    qx, qw = torch.empty(M, K, dtype=e4m3), torch.empty(N, K, dtype=e4m3)
    rec = {}
    with recording(execute=False) as launches:
        linear_fp8.fp8_gemm(qx, qw, torch.empty(M, 1), torch.empty(N, 1), None, torch.bfloat16, 0, 1, arch=arch)
        rec["gemm_rowwise"] = launches[-1]
        linear_fp8.fp8_gemm(qx, qw, torch.empty(M, K // 128), torch.empty(N // 128, K // 128), None, torch.bfloat16,
                            128, 128, arch=arch)
        rec["gemm_blockwise"] = launches[-1]
        # The dW product: both operands 1x128 tiles along the reduction (tokens), per-column scales of B.
        linear_fp8.fp8_gemm(qw, qx, torch.empty(N, K // 128), torch.empty(M, K // 128), None,
                            torch.bfloat16, 128, 1, arch=arch)
        rec["gemm_blockwise_dw"] = launches[-1]
        # MXFP8 (1x32 groups, power-of-two scales): tl.dot_scaled on sm_100, the per-block kernel elsewhere.
        linear_fp8.fp8_gemm(qx, qw, torch.empty(M, K // 32), torch.empty(N, K // 32), None, torch.bfloat16, 32, 1,
                            arch=arch)
        rec["gemm_mxfp8"] = launches[-1]
        linear_fp8.fp8_gemm(qx, qw, torch.empty(M, K // 32), torch.empty(N, K // 32), torch.empty(N, dtype=x.dtype),
                            torch.bfloat16, 32, 1, arch=arch, residual=torch.empty(M, N, dtype=x.dtype))
        rec["gemm_mxfp8_epilogue"] = launches[-1]  # bias + residual: 4 warps spilled here on sm_100
        # The dW product at a ragged token count: rows not 16-byte aligned (no 128-bit async copies).
        Kr = 1000
        linear_fp8.fp8_gemm(torch.empty(N, Kr, dtype=e4m3), torch.empty(M, Kr, dtype=e4m3), torch.empty(N, 32),
                            torch.empty(M, 32), None, torch.bfloat16, 32, 1, arch=arch)
        rec["gemm_mxfp8_ragged"] = launches[-1]
        if target.startswith("sm_"):
            scales = {"tma_tensorwise": (torch.empty(()), torch.empty(()), 0, 1),
                      "tma_rowwise": (torch.empty(M, 1), torch.empty(N, 1), 0, 1),
                      "tma_blockwise": (torch.empty(M, K // 128), torch.empty(N // 128, K // 128), 128, 128),
                      "tma_blockwise_dw": (torch.empty(M, K // 128), torch.empty(N, K // 128), 128, 1),
                      "tma_mxfp8": (torch.empty(M, K // 32), torch.empty(N, K // 32), 32, 1)}
            for name, (sa, sb, group_k, b_rows) in scales.items():
                linear_fp8.fp8_gemm(qx, qw, sa, sb, None, torch.bfloat16, group_k, b_rows, arch=arch, tma=True)
                rec[name] = launches[-1]
        quantize.quantize(x, e4m3, "rowwise", True, arch=arch)
        rec["quantize_rowwise"] = launches[-1]
        quantize.quantize(w, e4m3, "block128x128", False, arch=arch)
        rec["quantize_block128x128"] = launches[-1]
    return rec


def compile_rows(targets, kernels) -> list[dict]:
    import triton
    from test_matrix_instructions import _analyse, _gpu_target, _source

    rows = []
    for target in targets:
        launches = _record(target)
        for name in kernels:
            if name not in launches:
                continue  # the TMA kernels on AMD targets
            launch = launches[name]
            compiled = triton.compile(_source(launch, target), target=_gpu_target(target),
                                      options=dict(launch.options))
            row = {"target": target, "kernel": name, **_analyse(target, compiled)}
            code = compiled.asm.get("amdgcn") or _sass(compiled)
            row["fp8_instructions"] = sorted(set(re.findall(EXPECTED[target], code)))
            row["kernel_fn"] = launch.name
            if target.startswith("sm_"):
                row["mx_block_scale_ptx"] = sorted(set(re.findall(MX_PTX, compiled.asm["ptx"])))
                row["mma_count"] = len(re.findall(r"\bUTCQMMA\b|\bQGMMA\b", code))
                row["mx_block_scale_sass"] = len(re.findall(MX_SASS, code))
                row["tma_loads_in_loops"], row["tma_loads"] = tma_loads_in_loops(code)
                row["setmaxnreg"] = len(re.findall(r"\bUSETMAXREG\b", code))
                row["cp_async"] = len(re.findall(r"\bLDGSTS\b", code))
                row["mma_wait_depths"] = sorted({int(d, 16) for d in re.findall(r"DEPBAR\.LE gsb0, (0x[0-9a-f]+)",
                                                                                 code)})
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def tma_loads_in_loops(sass: str) -> tuple[int, int]:
    """(TMA loads inside a loop, all TMA loads) of a SASS listing. A loop is the span of a backward branch (a
    BRA to an address at or before its own); in a warp-specialized kernel the TMA loads sit in the producer's
    loop, which holds no matrix instruction (so the main-loop reading of inspect does not see them)."""
    listing = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    exits = [addr for addr, insn in listing if re.search(r"\bEXIT\b", insn)]
    loops = []
    for addr, insn in listing:
        m = re.search(r"\bBRA\S*\s+(0x[0-9a-f]+)", insn)
        if m and int(m.group(1), 16) <= addr and not any(int(m.group(1), 16) <= e <= addr for e in exits):
            loops.append((int(m.group(1), 16), addr))  # a span holding EXIT is a slow path's jump back
    loads = [addr for addr, insn in listing if re.search(r"\bUTMALDG\b", insn)]
    return sum(any(lo <= a <= hi for lo, hi in loops) for a in loads), len(loads)


def _sass(compiled) -> str:
    import tempfile

    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tools / "cuobjdump", "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def _run(targets, kernels) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, "--targets", ",".join(targets), "--kernels", ",".join(kernels)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _check(row) -> None:
    from wavefront.runtime import get_arch

    assert row["spill_bytes"] == 0, row
    assert row["shared_bytes"] <= get_arch(row["target"]).shared_mem_per_block, row
    if row["kernel"].startswith("gemm"):
        assert row["fp8_instructions"], f"no FP8 matrix instruction ({EXPECTED[row['target']]}) in {row}"
    if row["kernel"].startswith("gemm_mxfp8") and row["target"] == "sm_100":
        # native MXFP8: the scales are applied by the MMA itself, every MMA is the block-scaled one
        assert row["kernel_fn"] == "_mx_gemm_kernel", row
        assert row["mx_block_scale_ptx"], row
        assert row["mma_count"] > 0 and row["mx_block_scale_sass"] == row["mma_count"], row
    elif row["kernel"] == "tma_mxfp8" and row["target"] == "sm_100":
        assert row["kernel_fn"] == "_mx_gemm_tma_kernel", row
        assert row["mx_block_scale_ptx"], row
        assert row["mma_count"] > 0 and row["mx_block_scale_sass"] == row["mma_count"], row
    elif row["target"].startswith("sm_"):
        assert not row["mx_block_scale_ptx"], row  # sm_90 has no MX MMA: the per-block kernel
    if row["kernel"].startswith("tma_"):
        # The fast path: operands by TMA inside the producer's loop, no cp.async, warp-specialized.
        assert row["kernel_fn"] in TMA_KERNELS, row
        assert row["tma_loads_in_loops"] >= 2 and row["setmaxnreg"] > 0, row
        # No cp.async but sm_100's MX scales: tcgen05 reads them from tensor memory, and the compiler stages
        # the two [128, 4] fp32 scale tiles through shared memory by cp.async (4 KiB a step beside 32 KiB of
        # operands by TMA; by descriptor instead, the kernel spilled 16 B).
        assert row["cp_async"] == 0 or (row["kernel"], row["target"]) == ("tma_mxfp8", "sm_100"), row
    elif row["kernel"] in ("gemm_rowwise", "gemm_blockwise") and row["target"].startswith("sm_"):
        assert row["cp_async"] > 0 and row["tma_loads"] == 0, row  # the default: cp.async kernels


@pytest.mark.slow  # ~11 s of compiling: over the default suite's budget for FP8
def test_fp8_gemm_uses_the_fp8_matrix_units_on_mi300():
    """gfx942 alone (the FNUZ formats, the likeliest to regress): the quick check to run after a change to
    the FP8 GEMM; test_every_fp8_kernel covers all three targets."""
    rows = _run(["gfx942"], ["gemm_rowwise"])
    assert len(rows) == 1
    _check(rows[0])


@pytest.mark.slow  # three compiles, ~40 s on two cores
def test_mxfp8_gemm_uses_the_block_scaled_mma_on_sm100():
    """The native MXFP8 path: tl.dot_scaled lowers to tcgen05's block-scaled MMA with zero spills (plain, with
    the bias + residual epilogue, and with rows not 16-byte aligned)."""
    rows = _run(["sm_100"], list(MXFP8))
    assert len(rows) == len(MXFP8)
    _check(rows[0])


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_every_fp8_kernel(target):
    for row in _run([target], KERNELS):
        _check(row)


@pytest.mark.slow  # 80 s of compiling on two shared cores
def test_inspect_with_the_flag_shows_tma_and_warp_specialization(monkeypatch):
    """``WAVEFRONT_FP8_TMA=1 wavefront inspect --op linear_fp8 --targets sm_90,sm_100``: at the bench shapes
    (Llama-3-8B projections at 8192 tokens, all four recipes, forward and backward) every GEMM row is the TMA
    kernel, with TMA operations and setmaxnreg, 0 spills."""
    from wavefront.kernels.linear_fp8 import TMA_ENV_FLAG
    from wavefront.ops import get_spec
    from wavefront.workbench.static.inspect import inspect_ops

    monkeypatch.setenv(TMA_ENV_FLAG, "1")
    report = inspect_ops(["linear_fp8"], ["sm_90", "sm_100"])
    gemms = [r for r in report.rows if "gemm" in r.kernel]
    cases = [c.name for c in get_spec("linear_fp8").bench_cases]
    assert {(r.case, r.mode, r.target) for r in gemms} == {
        (c, mode, target) for c in cases for mode in ("fwd", "bwd") for target in ("sm_90", "sm_100")}
    for r in gemms:
        assert r.ok and r.kernel.split("#")[0] in TMA_KERNELS, (r.key, r.error)
        assert r.tma_ops > 0 and r.setmaxnreg > 0 and r.spill_bytes == 0, r.key

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--kernels", default=",".join(KERNELS))
    ns = parser.parse_args()
    print(json.dumps(compile_rows(ns.targets.split(","), ns.kernels.split(","))))
