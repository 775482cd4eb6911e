"""gpu_check.sh step 7b (sm_90 only): the FA3-schedule attention forward (kernels/attention_fa3.py, never run
before) for accuracy and then time, each row written as it is measured (<out>.jsonl) and the whole at the end
(<out>).

    python scripts/gpu_check_fa3.py OUT.json [SEQ ...]

Accuracy first, shortest first (a hang shows as the first missing row): vs the float64 reference, passing when
the error is at most the op's tolerance over eager's (SDPA math) error; the default kernel's and SDPA's (flash
backend) errors and the lse2 difference from the default kernel beside it. The shapes: a few heads (1..9 key
blocks, partial tiles) and one with more tiles than SMs (the persistent loop takes several tiles per program).
Then time at Llama-3-8B's shape (B 2, H 32, H_kv 8, S 4096 and 8192, d 128, causal and not) for: this kernel,
the default kernel, the Gluon wait-depth-1 kernel, SDPA flash and cuDNN backends, and flash-attn-4 (the CuTe-DSL
FlashAttention) when importable; a provider that fails records its error and the next one runs.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from wavefront import reference
from wavefront.kernels import attention as default_kernel
from wavefront.kernels import attention_fa3, attention_gluon
from wavefront.ops._spec import Tolerance


def _providers(q, k, v, causal: bool, scale: float, fa4) -> list[tuple[str, object]]:
    """(name, zero-argument call) per provider; None where the provider is not importable."""
    kv = [t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v)]
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, *kv, is_causal=causal, scale=scale)
        return run

    return [("fa3_schedule", lambda: attention_fa3.attention_fwd(q, k, v, causal, scale)),
            ("default", lambda: default_kernel.attention_fwd(q, k, v, causal, scale)),
            ("gluon_depth1", lambda: attention_gluon.attention_fwd(q, k, v, causal, scale)),
            ("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION)),
            ("sdpa_cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)),
            ("flash_attn_4", (lambda: fa4(qt, kt, vt, softmax_scale=scale, causal=causal)) if fa4 else None)]


def main(out: str, seqs: list[int]) -> int:
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        print(f"fa3: skipped, the device is sm_{cap[0]}{cap[1]}, not sm_90")
        return 0
    doc: dict[str, list] = {"accuracy": [], "timing": []}
    gen = torch.Generator("cuda").manual_seed(0)
    with open(out.removesuffix(".json") + ".jsonl", "a") as rows:

        def keep(kind: str, row: dict) -> None:
            doc[kind].append(row)
            print(row, flush=True)
            rows.write(json.dumps({"kind": kind, **row}) + "\n")
            rows.flush()

        _accuracy(keep, gen, seqs)
        _timing(keep, gen)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    ok = all(r["pass"] for r in doc["accuracy"])
    print("fa3: accuracy", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def _qkv(gen, b, h, hk, s, d):
    return [torch.randn(b, n, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for n in (h, hk, hk)]


def _accuracy(keep, gen, seqs: list[int]) -> None:
    shapes = [(1, 4, 2, s) for s in sorted(seqs)] + [(2, 32, 8, max(seqs))]
    for b, h, hk, s in shapes:
        for d, causal in ((64, False), (128, False), (128, True)):
            q, k, v = _qkv(gen, b, h, hk, s, d)
            scale = d ** -0.5
            ref = reference.attention(q.double(), k.double(), v.double(), causal, scale)
            eager = reference.attention_sdpa_math(q, k, v, causal, scale)
            o, lse2 = attention_fa3.attention_fwd(q, k, v, causal, scale)
            torch.cuda.synchronize()
            o_def, lse2_def = default_kernel.attention_fwd(q, k, v, causal, scale)
            o_sdpa = dict(_providers(q, k, v, causal, scale, None))["sdpa_flash"]()
            errs = {name: (x.double() - ref).abs().max().item()
                    for name, x in (("fa3", o), ("default", o_def), ("sdpa_flash", o_sdpa), ("eager", eager))}
            row = {"shape_b_h_hkv_s": [b, h, hk, s], "head_dim": d, "causal": causal,
                   **{f"err_{n}": e for n, e in errs.items()},
                   "lse2_max_diff_vs_default": (lse2 - lse2_def).abs().max().item()}
            row["bound"] = Tolerance().bound(errs["eager"], ref.abs().max().item(), q.dtype)
            row["pass"] = errs["fa3"] <= row["bound"] and row["lse2_max_diff_vs_default"] < 1e-2
            keep("accuracy", row)


def _timing(keep, gen) -> None:
    try:
        from flash_attn.cute import flash_attn_func as fa4  # flash-attn-4, [B, S, H, D]
        fa4_error = ""
    except Exception as exc:  # not installed / not built for this device: its rows say so
        fa4, fa4_error = None, f"unavailable: {type(exc).__name__}: {exc}"[:200]
    for s in (4096, 8192):
        for d, causal in ((128, True), (128, False)):
            q, k, v = _qkv(gen, 2, 32, 8, s, d)
            flops = 4 * 2 * 32 * s * s * d / (2 if causal else 1)
            for name, fn in _providers(q, k, v, causal, d ** -0.5, fa4):
                row = {"impl": name, "head_dim": d, "causal": causal, "shape_b_h_hkv_s": [2, 32, 8, s]}
                if fn is None:
                    row["error"] = fa4_error
                else:
                    try:
                        ms = do_bench(fn, warmup=25, rep=100)
                        row |= {"ms": ms, "tflops": flops / ms / 1e9}
                    except Exception as exc:  # one provider failing does not stop the others
                        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                keep("timing", row)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], [int(a) for a in sys.argv[2:]] or [128, 384, 1124]))
