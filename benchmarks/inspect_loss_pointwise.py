"""Ahead-of-time machine-code facts for the loss and pointwise kernels on sm_90 and gfx942 (no GPU needed).

    python benchmarks/inspect_loss_pointwise.py [--json out.json]

Each kernel is specialized exactly as its launcher would launch it at a benchmark shape (the launch is
recorded with ``recording(execute=False)``: same constexprs, same 16-byte alignment and divisibility
facts), compiled with ``triton.compile`` for GPUTarget("cuda", 90, 32) and GPUTarget("hip", "gfx942", 64),
and its assembly is counted: global loads/stores and how many are 128-bit (``ld.global.v4`` /
``global_load_dwordx4``), registers, and spills (cuobjdump's LOCAL / STACK bytes on NVIDIA, the
``.vgpr_spill_count`` note on AMD). num_warps for gfx942 comes from each kernel's own config function
given gfx942's limits. These are static facts about the code, not performance figures.

The registry-wide ``wavefront inspect`` tool covers every op the same way; this script is the check
the loss/pointwise kernels were tuned against.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "0")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from wavefront import runtime  # noqa: E402
from wavefront.kernels import adamw, cross_entropy, glu, rope  # noqa: E402
from wavefront.kernels._launch import Launch, TensorArg, recording  # noqa: E402
from wavefront.kernels.row_config import row_config  # noqa: E402
from wavefront.ops.adamw import step_scalars  # noqa: E402

_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
          torch.int64: "i64", torch.int32: "i32"}


def compile_launch(launch: Launch, target: GPUTarget):
    """triton.compile with the signature, constants and alignment attributes the JIT would derive."""
    sig, consts, attrs = {}, {}, {}
    args = iter(launch.args)
    for i, name in enumerate(launch.kernel.arg_names):
        if name in launch.constexprs:
            sig[name], consts[name] = "constexpr", launch.constexprs[name]
            continue
        a = next(args)
        if a is None or (isinstance(a, int) and not isinstance(a, bool) and a == 1):
            sig[name], consts[name] = "constexpr", a  # Triton specializes None and the integer 1
        elif isinstance(a, TensorArg):
            sig[name] = "*" + _TYPES[a.dtype]
            if a.aligned16:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            sig[name] = "i1"
        elif isinstance(a, int):
            sig[name] = "i64" if abs(a) >= 2**31 else "i32"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    options = {k: v for k, v in launch.options.items() if k in ("num_warps", "num_stages")}
    return triton.compile(ASTSource(fn=launch.kernel, signature=sig, constexprs=consts, attrs=attrs),
                          target=target, options=options)


def facts(kernel, family: str) -> dict:
    if family == "nvidia":
        asm = kernel.asm["ptx"]
        loads, stores = re.findall(r"ld\.global[.\w]*", asm), re.findall(r"st\.global[.\w]*", asm)
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
        return {"loads": len(loads), "loads_128b": sum(".v4" in x for x in loads), "stores": len(stores),
                "stores_128b": sum(".v4" in x for x in stores), "registers": int(m.group(1)),
                "spill_bytes": int(m.group(2)) + int(m.group(4))}
    asm = kernel.asm["amdgcn"]
    loads = re.findall(r"\b(?:global|buffer)_load_\w+", asm)
    stores = re.findall(r"\b(?:global|buffer)_store_\w+", asm)
    spills = re.search(r"\.vgpr_spill_count:\s*(\d+)", asm)
    vgprs = re.search(r"\.vgpr_count:\s*(\d+)", asm)
    return {"loads": len(loads), "loads_128b": sum(x.endswith("x4") for x in loads), "stores": len(stores),
            "stores_128b": sum(x.endswith("x4") for x in stores), "registers": int(vgprs.group(1)),
            "spill_bytes": 4 * int(spills.group(1))}


def launches(arch) -> list[tuple[str, Launch]]:
    """Recorded launches at benchmark shapes (Llama 3 8B), with num_warps from arch's config tables."""
    bf16 = torch.bfloat16
    out = []

    def rec(name, fn, warps):
        with recording(execute=False) as ls:
            fn()
        out.extend((name, dataclasses.replace(lc, options={**lc.options, "num_warps": warps})) for lc in ls)

    gate = torch.empty(64, 14336, dtype=bf16)
    glu_warps = glu.glu_config(14336, bf16, arch).num_warps
    rec("swiglu fwd (bf16, 14336)", lambda: glu.glu_fwd(gate, gate, 0), glu_warps)
    rec("geglu bwd (bf16, 14336)", lambda: glu.glu_bwd(gate, gate, gate, 1), glu_warps)
    q, k, cos = (torch.empty(1, 32, 16, 128, dtype=bf16), torch.empty(1, 8, 16, 128, dtype=bf16),
                 torch.empty(16, 128, dtype=bf16))
    rec("rope fwd (bf16, 32/8 heads x 128)", lambda: rope.rope(q, k, cos, cos, rope.POS_DIRECT, None, False),
        rope.rope_config(32, 8, 128, 128, bf16, arch).num_warps)
    logits, target = torch.empty(16, 128256, dtype=bf16), torch.zeros(16, dtype=torch.int64)
    ce_warps = row_config(128256, bf16, arch, online=True).num_warps
    opts = dict(ignore_index=-100, label_smoothing=0.0, z_loss=0.0)
    rec("cross_entropy fwd (bf16, 128256)",
        lambda: cross_entropy.cross_entropy_rows(logits, target, None, softcap=None, **opts), ce_warps)
    rec("cross_entropy bwd softcap (bf16, 128256)",
        lambda: cross_entropy.cross_entropy_rows(logits, target, None, softcap=30.0, stats=torch.empty(16, 2),
                                                 grad=logits, scale=torch.ones(16), **opts), ce_warps)
    p16, p32 = torch.empty(1 << 20, dtype=bf16), torch.empty(1 << 20)
    scal = torch.tensor([step_scalars(1e-3, 0.9, 0.999, 1e-8, 0.01, 1)], dtype=torch.float64)
    rec("adamw bf16 + fp32 master", lambda: adamw.adamw_multi_tensor([p16], [p16], [p32], [p32], None, [p32], scal,
                                                                       maximize=False),
        adamw.adamw_config(bf16, arch).num_warps)
    rec("adamw fp32", lambda: adamw.adamw_multi_tensor([p32], [p32], [p32], [p32], None, None, scal, maximize=False),
        adamw.adamw_config(torch.float32, arch).num_warps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    a = parser.parse_args()
    rows = []
    for target_name, target, family in (("sm_90", GPUTarget("cuda", 90, 32), "nvidia"),
                                        ("gfx942", GPUTarget("hip", "gfx942", 64), "amd")):
        for name, launch in launches(runtime.get_arch(target_name)):
            row = {"target": target_name, "kernel": name, "num_warps": launch.options["num_warps"],
                   **facts(compile_launch(launch, target), family)}
            rows.append(row)
            print(f"{target_name:7s} {name:42s} warps {row['num_warps']:2d}  loads {row['loads']:3d} "
                  f"(128-bit {row['loads_128b']:2d})  stores {row['stores']:3d} (128-bit {row['stores_128b']:2d})  "
                  f"regs {row['registers']:3d}  spills {row['spill_bytes']} B")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"schema": "wavefront.inspect_loss_pointwise/1", "triton": triton.__version__, "rows": rows},
                      f, indent=2)


if __name__ == "__main__":
    main()
