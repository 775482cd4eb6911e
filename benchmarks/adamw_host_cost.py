"""Host (CPU) cost of one wavefront.optim.AdamW step for a Llama-3-8B-shaped parameter list.

    TRITON_INTERPRET=1 python benchmarks/adamw_host_cost.py --json benchmarks/results/adamw-host_cpu_<date>.json

The parameter list is Llama 3 8B's: 291 tensors, 8.03e9 elements (embedding and LM head 128256 x 4096; per
layer q/o 4096 x 4096, k/v 1024 x 4096, gate/up 14336 x 4096, down 4096 x 14336 and two norms of 4096;
the final norm), bf16 with fp32 master weights and moments: six tensor columns.

Nothing of that size is allocated and no kernel runs; what is timed is the Python and PyTorch work the
host does per step, which is what stalls a GPU that waits for the launch:

- ``launcher``: the kernel's host path (kernels/adamw.py ``adamw_multi_tensor``) on ``meta`` tensors of the
  true shapes, launches recorded and not executed (``recording(execute=False)``), for compile target
  sm_90 (``assume_target``). ``steady``: the tables are cached (every step after the first while the
  addresses stay the same); ``rebuild``: the cache is emptied before each call (the first step, or a
  step after the parameter set changed). Its work is per tensor, never per element or per block.
- ``step``: the whole ``AdamW.step()`` (state lookup, step counters, scalars, the op, the launcher) on 291
  one-element CPU parameters under the interpreter with launches recorded and not executed. Element
  counts never enter the host path except through the launcher's tables (measured above at full size),
  so this is the full host cost of a step.

These are host-CPU timings of host work (the figure the issue asks for), not GPU performance figures.
Quantiles over --repeats calls after --warmup calls; time.perf_counter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

HIDDEN, INTERMEDIATE, KV, VOCAB, LAYERS = 4096, 14336, 1024, 128256, 32


def llama3_8b_shapes() -> list[tuple[int, ...]]:
    layer = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN), (INTERMEDIATE, HIDDEN),
             (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE), (HIDDEN,), (HIDDEN,)]
    return [(VOCAB, HIDDEN), *(s for _ in range(LAYERS) for s in layer), (HIDDEN,), (VOCAB, HIDDEN)]


def _quantiles(samples_s: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in samples_s)
    q = statistics.quantiles(ms, n=10)
    return {"median_ms": statistics.median(ms), "p10_ms": q[0], "p90_ms": q[-1], "min_ms": ms[0], "n": len(ms)}


def _time(fn, warmup: int, repeats: int) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return _quantiles(samples)


def time_launcher(shapes, warmup: int, repeats: int) -> dict:
    from wavefront import runtime
    from wavefront.kernels import adamw as kernels
    from wavefront.kernels._launch import recording

    def meta(dtype):
        return [torch.empty(s, dtype=dtype, device="meta") for s in shapes]

    params, grads = meta(torch.bfloat16), meta(torch.bfloat16)
    exp_avgs, exp_avg_sqs, masters = meta(torch.float32), meta(torch.float32), meta(torch.float32)
    scalars = torch.empty((len(shapes), 7), dtype=torch.float64, device="meta")
    cache = kernels.TableCache()

    def call():
        kernels.adamw_multi_tensor(params, grads, exp_avgs, exp_avg_sqs, None, masters, scalars, maximize=False,
                                   cache=cache)

    out = {}
    with runtime.assume_target("sm_90", 132), recording(execute=False) as launches:
        call()
        tables = next(iter(cache._tables.values()))
        out["steady"] = _time(call, warmup, repeats)

        def rebuild():
            cache._tables.clear()
            call()

        out["rebuild"] = _time(rebuild, max(1, warmup // 10), max(5, repeats // 10))
    out["launches_per_step"] = 1
    out["grid_programs"] = launches[0].grid[0]
    out["table_bytes"] = sum(t.numel() * t.element_size() for t in (tables.ptrs, tables.numels, tables.block_offsets))
    return out


def time_step(n_params: int, warmup: int, repeats: int) -> dict:
    from wavefront import runtime
    from wavefront.kernels._launch import recording
    from wavefront.optim import AdamW

    if not runtime.uses_triton("cpu"):
        raise SystemExit("set TRITON_INTERPRET=1: the step is timed on the kernel path (launches recorded only)")
    params = [torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16)) for _ in range(n_params)]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = AdamW(params, lr=1e-4, master_weights=True)
    with recording(execute=False) as launches:
        opt.step()
        n_launches = len(launches)
        out = _time(opt.step, warmup, repeats)
    out["launches_per_step"] = n_launches
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
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--json", default=None, help="write the result document here ('-': stdout)")
    a = p.parse_args()
    if a.warmup < 0 or a.repeats < 10:
        print("adamw_host_cost: --warmup must be >= 0 and --repeats >= 10", file=sys.stderr)
        raise SystemExit(2)
    import triton

    shapes = llama3_8b_shapes()
    doc = {
        "schema": "wavefront.adamw_host_cost/1",
        "what": "host-CPU time of one AdamW step's host work (not a GPU figure); see the script's docstring",
        "command": " ".join(["TRITON_INTERPRET=1 python benchmarks/adamw_host_cost.py", *sys.argv[1:]]),
        "model": "llama3-8b", "n_tensors": len(shapes), "n_elements": sum(torch.Size(s).numel() for s in shapes),
        "param_dtype": "bf16", "master_weights": True,
        "launcher": time_launcher(shapes, a.warmup, a.repeats),
        "step": time_step(len(shapes), a.warmup, a.repeats),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git_sha": _git_sha(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__},
        "machine": {"cpu": platform.processor() or platform.machine(), "os_cpus": os.cpu_count(),
                    # A shared machine's load inflates medians and tails; min_ms is the uncontended estimate.
                    "load_average_1m": os.getloadavg()[0]},
    }
    doc["goal_ms"] = 1.0
    # The step includes the launcher's per-tensor work (its cost does not depend on element counts).
    doc["host_ms_per_step"] = doc["step"]["median_ms"]
    text = json.dumps(doc, indent=2)
    if a.json == "-":
        print(text)
    elif a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(f"{doc['n_tensors']} tensors, {doc['n_elements'] / 1e9:.2f}e9 elements: launcher "
          f"{doc['launcher']['steady']['median_ms']:.3f} ms (tables cached; rebuild "
          f"{doc['launcher']['rebuild']['median_ms']:.2f} ms), whole step {doc['step']['median_ms']:.3f} ms "
          f"(host CPU, median of {a.repeats})", file=sys.stderr)


if __name__ == "__main__":
    main()
