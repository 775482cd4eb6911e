"""Peak extra memory of the LM-head loss: wavefront.ops.linear_cross_entropy vs eager matmul + cross-entropy.

    python benchmarks/linear_cross_entropy_memory.py --tokens 8192 --vocab 128256 --hidden 64 --json out.json
    python benchmarks/linear_cross_entropy_memory.py --dtype bf16 --hidden 4096 --dweight both --json out.json

Both contenders run forward + backward of a mean-reduced loss on the same [tokens, hidden] input and
[vocab, hidden] weight (which are not counted); the meter (wavefront.workbench.bench.live_bytes) counts every
tensor created inside the region until it is freed, including the gradients it leaves behind.

- eager: ``F.cross_entropy(F.linear(hidden, weight).float(), target)`` (Hugging Face's order). At the
  full size it runs on ``meta`` tensors (shapes only: the same ops, allocations and frees, no memory),
  and with ``--eager-real`` on real CPU tensors too (needs ~3x the logits in RAM).
- wavefront: real CPU tensors. The backend is whatever the environment gives: with TRITON_INTERPRET=1 the
  per-chunk cross-entropy runs the Triton kernel under the interpreter (slow: ~0.1 s per row at vocab
  128k); with it unset (backend cpu-reference) it runs the kernel's row-wise PyTorch twin. The chunking,
  buffers and GEMMs live in the op layer and are the same code on every backend; the per-chunk cross-
  entropy allocates only its [chunk] outputs in both (the twin adds O(vocab) row temporaries).
  ``--cross-check-tokens N`` runs both backends at N tokens in subprocesses and reports both peaks.

Not a performance measurement: wall times printed here are CPU correctness runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def measure(fn) -> dict:
    from wavefront.workbench.bench.live_bytes import LiveBytesMeter

    t0 = time.perf_counter()
    with LiveBytesMeter(keep_biggest=6) as meter:
        fn()
    r = meter.result
    return {"peak_bytes": r.peak_bytes, "end_bytes": r.live_bytes, "n_allocations": r.n_allocations,
            "biggest": [[b, op] for b, op in r.biggest], "wall_s_cpu_not_a_perf_figure": time.perf_counter() - t0}


def inputs(tokens: int, vocab: int, hidden: int, dtype: torch.dtype, device: str):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * hidden ** -0.5).to(device=device, dtype=dtype).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
    return h, w, t


def run_eager(tokens, vocab, hidden, dtype, device) -> dict:
    h, w, t = inputs(tokens, vocab, hidden, dtype, device)

    def step():
        F.cross_entropy(F.linear(h, w).float(), t).backward()

    return measure(step)


def run_ours(tokens, vocab, hidden, dtype, dweight="auto") -> dict:
    import importlib

    from wavefront import ops, runtime

    lce = importlib.import_module("wavefront.ops.linear_cross_entropy")  # the module, not the op it exports
    from wavefront.ops.linear_cross_entropy import chunk_tokens

    if dweight == "accumulate":  # force the fp32 cross-chunk accumulator (the path before dweight slices)
        lce.DWEIGHT_ACCUMULATOR_MAX_BYTES = float("inf")

    h, w, t = inputs(tokens, vocab, hidden, dtype, "cpu")

    def step():
        ops.linear_cross_entropy(h, w, t).backward()

    out = measure(step)
    out["backend"] = runtime.backend("cpu")
    out["dweight"] = "slices" if lce.dweight_by_slices(vocab, hidden, dtype) else "accumulate"
    out["chunk_tokens"] = chunk_tokens(tokens, vocab, torch.empty((), dtype=dtype).element_size())
    return out


def _git_sha() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--eager-real", action="store_true", help="also run eager on real CPU tensors")
    p.add_argument("--only", choices=("both", "ours", "eager"), default="both")
    p.add_argument("--dweight", choices=("auto", "accumulate", "both"), default="auto",
                   help="16-bit weights: the op's own choice, the fp32 accumulator forced, or both (subprocess)")
    p.add_argument("--cross-check-tokens", type=int, default=0,
                   help="also run ours at this many tokens under the interpreter and on cpu-reference")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    full_logits = a.tokens * a.vocab * torch.empty((), dtype=dtype).element_size()
    doc = {"schema": "wavefront.lce_memory/1", "tokens": a.tokens, "vocab": a.vocab, "hidden": a.hidden,
           "dtype": a.dtype, "full_logits_bytes": full_logits, "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": "cpu", "git_sha": _git_sha()}
    if a.only in ("both", "eager"):
        doc["eager_meta"] = run_eager(a.tokens, a.vocab, a.hidden, dtype, "meta")
        if a.eager_real:
            doc["eager_cpu"] = run_eager(a.tokens, a.vocab, a.hidden, dtype, "cpu")
    if a.only in ("both", "ours"):
        doc["wavefront"] = run_ours(a.tokens, a.vocab, a.hidden, dtype, "auto" if a.dweight == "both" else a.dweight)
        doc["wavefront_peak_over_full_logits"] = doc["wavefront"]["peak_bytes"] / full_logits
        if a.dweight == "both":  # a fresh process: the module constant is patched there
            cmd = [sys.executable, __file__, "--tokens", str(a.tokens), "--vocab", str(a.vocab), "--hidden",
                   str(a.hidden), "--dtype", a.dtype, "--only", "ours", "--dweight", "accumulate", "--json", "-"]
            res = subprocess.run(cmd, check=True, capture_output=True, text=True)
            doc["wavefront_accumulate"] = json.loads(res.stdout)["wavefront"]
            doc["wavefront_accumulate_peak_over_full_logits"] = doc["wavefront_accumulate"]["peak_bytes"] / full_logits
    if "eager_meta" in doc:
        doc["eager_peak_over_full_logits"] = doc["eager_meta"]["peak_bytes"] / full_logits
    # Beyond the gradients: peak minus what is left at the end (dhidden and dweight, which every
    # implementation must return): the working memory the loss itself needs.
    for key in ("eager_meta", "wavefront", "wavefront_accumulate"):
        if key in doc:
            r = doc[key]
            r["beyond_grads_bytes"] = r["peak_bytes"] - r["end_bytes"]
            r["beyond_grads_over_full_logits"] = r["beyond_grads_bytes"] / full_logits
    if a.cross_check_tokens:
        doc["cross_check"] = {}
        for name, interp in (("cpu-interpreter", "1"), ("cpu-reference", "0")):
            cmd = [sys.executable, __file__, "--tokens", str(a.cross_check_tokens), "--vocab", str(a.vocab),
                   "--hidden", str(a.hidden), "--dtype", a.dtype, "--only", "ours", "--json", "-"]
            env = {**os.environ, "TRITON_INTERPRET": interp}
            res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
            doc["cross_check"][name] = json.loads(res.stdout)["wavefront"]
    text = json.dumps(doc, indent=2)
    if a.json == "-":
        print(text)
    else:
        if a.json:
            with open(a.json, "w") as f:
                f.write(text + "\n")
        mib = 2**20
        print(f"full logits {full_logits / mib:.1f} MiB ({a.tokens} x {a.vocab} {a.dtype})")
        for key in ("eager_meta", "eager_cpu", "wavefront", "wavefront_accumulate"):
            if key in doc:
                print(f"{key:>12}: peak {doc[key]['peak_bytes'] / mib:9.1f} MiB "
                      f"({doc[key]['peak_bytes'] / full_logits:.3f} x full logits); beyond the gradients "
                      f"{doc[key]['peak_bytes'] / mib - doc[key]['end_bytes'] / mib:9.1f} MiB "
                      f"({(doc[key]['peak_bytes'] - doc[key]['end_bytes']) / full_logits:.3f} x)")
        for name, r in doc.get("cross_check", {}).items():
            print(f"cross-check {a.cross_check_tokens} tokens {name}: peak {r['peak_bytes'] / mib:.2f} MiB")


if __name__ == "__main__":
    main()
