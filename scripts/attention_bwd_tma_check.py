"""On an sm_90/sm_100 GPU: the attention backward's dK/dV kernel on its TMA path (the default there) against
its pointer path, deterministic and atomic dQ: accuracy first (float64 reference, the accuracy rule with
eager bf16 as the yardstick), then time (CUDA events, median of triton.testing.do_bench), Llama-3-8B heads.

    PYTHONPATH=src python scripts/attention_bwd_tma_check.py [--out DIR] [--seqs 1024,8192]

Writes attention_bwd_tma_<device>_<yyyymmdd>.json under --out (default: $OUT or .); exits 1 when a path
fails the accuracy rule (the TMA path must then not stay the default), 2 without a CUDA GPU."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--seqs", default="1024,8192")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("attention_bwd_tma_check: no CUDA GPU", file=sys.stderr)
        return 2
    import triton.testing

    from wavefront import reference
    from wavefront.kernels import attention as kernels
    from wavefront.ops._spec import Tolerance

    dev = torch.device("cuda")
    rows, ok = [], True
    for seq in map(int, args.seqs.split(",")):
        for causal in (True, False):
            gen = torch.Generator(device=dev).manual_seed(0)
            q, k, v, do = (torch.randn(1, h, seq, 128, device=dev, generator=gen, dtype=torch.bfloat16)
                           for h in (32, 8, 8, 32))
            scale = 128 ** -0.5
            o, lse2 = kernels.attention_fwd(q, k, v, causal, scale)
            want = None
            if seq <= 2048:  # the float64 reference holds S^2 per head
                ref = [t.double().requires_grad_() for t in (q, k, v)]
                reference.attention(*ref, causal=causal, scale=scale).backward(do.double())
                eager = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                reference.attention_sdpa_math(*eager, causal=causal, scale=scale).backward(do)
                want = [(r.grad, e.grad) for r, e in zip(ref, eager, strict=True)]
            for deterministic in (True, False):
                for tma in (True, False):
                    run = functools.partial(kernels.attention_bwd, do, q, k, v, o, lse2, causal, scale,
                                            deterministic=deterministic, tma=tma)
                    row = {"seq": seq, "causal": causal, "deterministic": deterministic, "tma": tma}
                    if want is not None:
                        errs = []
                        for ours, (r, e) in zip(run(), want, strict=True):
                            bound = Tolerance().bound(float((e.double() - r).abs().max()), float(r.abs().max()),
                                                      q.dtype)
                            errs.append((float((ours.double() - r).abs().max()), bound))
                        row["max_err_vs_bound"] = errs
                        row["accurate"] = all(err <= bound for err, bound in errs)
                        ok &= row["accurate"]
                    row["median_ms"] = triton.testing.do_bench(run, return_mode="median")
                    flops = 2.5 * 4 * 32 * seq * seq * 128 * (0.5 if causal else 1.0)
                    row["tflops"] = flops / row["median_ms"] / 1e9
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    name = torch.cuda.get_device_name().replace(" ", "-").lower()
    path = os.path.join(args.out, f"attention_bwd_tma_{name}_{datetime.date.today():%Y%m%d}.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
