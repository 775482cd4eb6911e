"""Machine-code proof for the matrix-unit kernels: compiled ahead of time for each GPU target at their
default configurations, attention and linear must contain the target's matrix instructions (HMMA on sm_80,
HGMMA (wgmma) on sm_90, tcgen05 (UTC*MMA) on sm_100, MFMA on gfx90a/gfx942, WMMA on gfx1100), spill no
registers, and fit shared memory / LDS.

The launches are the ones the ops make (recorded through ``wavefront.kernels._launch`` with
``execute=False``, the launcher given the target's :class:`~wavefront.runtime.Arch`), so the
specialization is exactly what a real call produces. Compiling needs real ``@triton.jit`` functions, not
the interpreter's, so each check runs this file as a script in a subprocess without TRITON_INTERPRET:

    python tests/ops/test_matrix_instructions.py --targets sm_90,gfx942 --head-dims 128 [--markdown]

Default suite: sm_90 and gfx942, the forward kernels at head_dim 128. ``-m slow``: every kernel, all six
targets, head dims 64, 128 and 256.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TARGETS = ("sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100")
#: The matrix instruction each target's kernels must contain (SASS mnemonics on NVIDIA: HGMMA is wgmma,
#: UTC*MMA is tcgen05.mma; AMD assembly on AMD).
EXPECTED = {"sm_80": "HMMA", "sm_90": "HGMMA", "sm_100": "UTCHMMA", "gfx90a": "v_mfma", "gfx942": "v_mfma",
            "gfx1100": "v_wmma"}
_FIND = {"cuda": r"\b(?:HMMA|HGMMA|UTC\w*MMA|IMMA)\b", "hip": r"\bv_(?:mfma|wmma)\w*"}
KERNELS = ("attention_fwd", "attention_bwd_delta", "attention_bwd_dkdv", "attention_bwd_dq", "linear_fwd",
           "linear_fwd_plain", "linear_fwd_residual", "linear_bwd_dx", "linear_bwd_dw")
NO_MATRIX_UNIT = {"attention_bwd_delta"}  # a row reduction: no product to put on the matrix units

# Known gaps, each with its reason (docs/kernels-attention-gemm.md): (target, kernel, head_dim) -> reason.
KNOWN_SPILLS: dict[tuple[str, str, int], str] = {}  # None since gfx1100 attention chunks its head dim (d_chunk)
# (target, kernel, head_dim) -> (instruction found instead, reason). None since the head_dim 256 dK/dV
# kernel splits its columns over programs (d_split) and keeps wgmma/tcgen05 tiles.
KNOWN_OTHER_INSTRUCTION: dict[tuple[str, str, int], tuple[str, str]] = {}


# ---------------------------------------------------------------------------------------------------
# The compile side (runs in the subprocess).

def _record(target: str, head_dim: int):
    import torch

    from wavefront.kernels import attention, linear
    from wavefront.kernels._launch import recording
    from wavefront.runtime import get_arch

    arch = get_arch(target)
    bf16 = torch.bfloat16
    q = torch.empty(1, 4, 256, head_dim, dtype=bf16)
    kv = torch.empty(1, 2, 256, head_dim, dtype=bf16)
    x, w, b = torch.empty(512, 256, dtype=bf16), torch.empty(384, 256, dtype=bf16), torch.empty(384, dtype=bf16)
    r = torch.empty(512, 384, dtype=bf16)
    with recording(execute=False) as rec:
        o, lse = attention.attention_fwd(q, kv, kv, True, 0.1, arch=arch)
        attention.attention_bwd(o, q, kv, kv, o, lse, True, 0.1, arch=arch)
        y, g = linear.linear_fwd(x, w, b, r, "gelu", True, arch=arch)
        linear.linear_fwd(x, w, None, None, None, False, arch=arch)
        linear.linear_fwd(x, w, None, r, None, False, arch=arch)
        linear.linear_bwd(y, x, w, g, True, True, True, arch=arch)
    return dict(zip(KERNELS, rec, strict=True))


class _TensorProxy:
    """What Triton's specialization reads from a tensor argument: dtype, pointer, byte range."""

    def __init__(self, arg):
        import torch

        self.dtype = arg.dtype
        self._ptr = arg.data_ptr
        itemsize = torch.empty((), dtype=arg.dtype).element_size()
        self._range = 0 if 0 in arg.shape else (sum((n - 1) * abs(st) for n, st in zip(arg.shape, arg.stride,
                                                                                      strict=True)) + 1) * itemsize

    def data_ptr(self) -> int:
        return self._ptr

    def ptr_range(self) -> int:
        return self._range


def _source(launch, target: str):
    """The ASTSource Triton's JIT would build for this launch on `target`: its own binder decides the
    signature, the constants (None, ints equal to 1), tt.divisibility 16 and, on AMD, tt.pointer_range 32
    (buffer instructions for tensors under 2 GiB)."""
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from wavefront.kernels._launch import TensorArg

    fn = launch.kernel
    backend = make_backend(_gpu_target(target))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    args = tuple(_TensorProxy(a) if isinstance(a, TensorArg) else a for a in launch.args)
    kwargs = dict(launch.constexprs) | dict(launch.options)
    bound, specialization, opts = binder(*args, **kwargs)
    _, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, opts)
    return ASTSource(fn, signature, constexprs, attrs)


def _gpu_target(target: str):
    from triton.backends.compiler import GPUTarget

    if target.startswith("sm_"):
        return GPUTarget("cuda", int(target[3:]), 32)
    return GPUTarget("hip", target, 32 if target.startswith("gfx11") else 64)


def _analyse(target: str, compiled) -> dict:
    import triton

    if "cubin" in compiled.asm:
        tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([tools / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True,
                                   check=True).stdout
            sass = subprocess.run([tools / "cuobjdump", "-sass", f.name], capture_output=True, text=True,
                                  check=True).stdout
        regs, stack, local = (int(v) for v in re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)",
                                                         usage).groups())
        code, spill_bytes = sass, stack + local
    else:
        code = compiled.asm["amdgcn"]

        def field(key):
            m = re.search(rf"\.{key}:\s+(\d+)", code)
            return int(m.group(1)) if m else 0

        # .vgpr_count is the unified file's total on gfx90a/gfx942 (VGPRs and AGPRs: 490 = 256 + 234 for the
        # d128 dK/dV kernel), so the AGPRs are not added again.
        regs = field("vgpr_count")
        # Per lane, like the NVIDIA figure is per thread.
        spill_bytes = 4 * (field("vgpr_spill_count") + field("sgpr_spill_count"))
    found = sorted(set(re.findall(_FIND["cuda" if target.startswith("sm_") else "hip"], code)))
    return {"regs": regs, "spill_bytes": spill_bytes, "shared_bytes": compiled.metadata.shared,
            "matrix_instructions": found, "setprio": len(re.findall(r"\bs_setprio\b", code))}


def compile_table(targets, head_dims, kernels) -> list[dict]:
    import triton

    rows = []
    for target in targets:
        for head_dim in head_dims:
            launches = _record(target, head_dim)
            for name in kernels:
                launch = launches[name]
                compiled = triton.compile(_source(launch, target), target=_gpu_target(target),
                                          options=dict(launch.options))
                c = launch.constexprs
                tile = f"{c.get('BLOCK_M')}x{c.get('BLOCK_N')}" + (f"x{c['BLOCK_K']}" if "BLOCK_K" in c else "")
                rows.append({"target": target, "kernel": name,
                             "head_dim": head_dim if name.startswith("attention") else None, "tile": tile,
                             "num_warps": launch.options["num_warps"], **_analyse(target, compiled)})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def markdown(rows) -> str:
    lines = ["| kernel | target | head_dim | tile | warps | regs | spill B | smem/LDS B | matrix instr |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['target']} | {r['head_dim'] or '-'} | {r['tile']} | {r['num_warps']} | "
                     f"{r['regs']} | {r['spill_bytes']} | {r['shared_bytes']} | "
                     f"{', '.join(r['matrix_instructions']) or '-'} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# The test side.

def _run(targets, head_dims, kernels) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, __file__, "--targets", ",".join(targets), "--head-dims",
                           ",".join(map(str, head_dims)), "--kernels", ",".join(kernels)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _check(row) -> str | None:
    """Assert everything about one compiled kernel; returns the reason when it is a known spiller."""
    from wavefront.runtime import get_arch

    key = (row["target"], row["kernel"], row["head_dim"])
    assert row["shared_bytes"] <= get_arch(row["target"]).shared_mem_per_block, row
    if row["kernel"] not in NO_MATRIX_UNIT:
        want = KNOWN_OTHER_INSTRUCTION.get(key, (EXPECTED[row["target"]],))[0]
        assert any(i.startswith(want) for i in row["matrix_instructions"]), f"no {want} in {row}"
    if key in KNOWN_SPILLS:
        assert row["spill_bytes"] > 0, f"{key} no longer spills: remove it from KNOWN_SPILLS"
        return KNOWN_SPILLS[key]
    assert row["spill_bytes"] == 0, row
    return None


@pytest.mark.parametrize("target", ["sm_90", "gfx942"])
def test_forward_kernels_use_the_matrix_units(target):
    rows = _run([target], [128], ["attention_fwd", "linear_fwd"])
    assert len(rows) == 2
    for row in rows:
        assert _check(row) is None
    if target == "gfx942":
        # The CDNA forward's entry (num_stages 4) is the depth at which Triton's AMD backend schedules the
        # QK^T -> PV loop as two chained dots and its ping-pong pass brackets the clusters with s_setprio
        # (docs/kernels-attention-gemm.md): a change of depth, dot count or Triton version that loses it fails.
        fwd = next(r for r in rows if r["kernel"] == "attention_fwd")
        assert fwd["setprio"] > 0 and "v_mfma_f32_32x32x8_bf16" in fwd["matrix_instructions"], fwd


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("target", TARGETS)
def test_every_kernel_every_target(target, head_dim):
    kernels = KERNELS if head_dim == 128 else tuple(k for k in KERNELS if k.startswith("attention"))
    known = [reason for row in _run([target], [head_dim], kernels) if (reason := _check(row))]
    if known:
        pytest.xfail("; ".join(sorted(set(known))))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--markdown", action="store_true")
    ns = parser.parse_args()
    table = compile_table(ns.targets.split(","), [int(d) for d in ns.head_dims.split(",")], ns.kernels.split(","))
    print(markdown(table) if ns.markdown else json.dumps(table))
