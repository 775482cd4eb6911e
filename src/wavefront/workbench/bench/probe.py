"""Time one op of whatever wavefront is importable: the measuring end of ``compare --git`` and ``bisect``.

Other revisions of the code may predate this harness, so this file, timer.py and runnable.py are copied
into a temporary package and run against the revision's ``src/`` (``PYTHONPATH=<probe dir>:<rev>/src``);
they rely only on the registry's stable surface (``wavefront.ops.REGISTRY``, ``OpSpec.fn``,
``eager_fn``, ``make_inputs``, ``cases``/``bench_cases``) and import each other relatively.

    python -m <pkg>.probe --op rms_norm --case llama3-8b_hidden --mode fwd --reps 30     # one-shot
    python -m <pkg>.probe --serve        # JSON requests on stdin, one JSON answer per line on stdout

One-shot output: the last stdout line is ``{"samples_us": [...], ...}``; exit code 3 when the op or case
does not exist in this revision (bisect treats it as "skip"), 4 when measuring failed. On a CPU the
samples are wall times of the Triton interpreter: not performance figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib

EXIT_MISSING = 3
EXIT_FAILED = 4


class Missing(LookupError):
    pass


def _setup():
    import torch  # lazy: torch-free import

    if not torch.cuda.is_available():
        # Set before any kernel module is imported, as the CLI and the tests do.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        # Two probes take turns on the same cores; an idle probe's spinning OpenMP workers would otherwise
        # slow the other one's first repetitions by 1000x on a small machine.
        torch.set_num_threads(1)
    return torch


_COMPILED: dict[str, object] = {}
_CONTEXT: dict[str, object] = {}


def _find(op: str, case: str):
    from wavefront.ops import REGISTRY  # lazy: the portable probe imports the revision under test on use

    if op not in REGISTRY:
        raise Missing(f"op {op!r} is not registered in this revision")
    spec = REGISTRY[op]
    for c in (*spec.bench_cases, *spec.cases):
        if c.name == case:
            return spec, c
    raise Missing(f"op {op!r} has no case {case!r} in this revision")


def _provider_fn(spec, provider: str):
    import torch  # lazy: torch-free import

    if provider == "wavefront":
        return spec.fn
    if provider == "eager":
        return spec.eager_fn
    if provider == "torch_compile":
        return _COMPILED.setdefault(spec.name, torch.compile(spec.eager_fn, dynamic=False))
    raise ValueError(f"provider must be wavefront, eager or torch_compile here; got {provider!r}")


def _clock_and_flush(torch, device, flush_bytes: int):
    from . import timer  # lazy: the portable probe imports the revision under test on use

    if device.type != "cuda":
        return timer.WallClock(), None
    if "flusher" not in _CONTEXT:
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
        _CONTEXT["flusher"] = timer.CacheFlusher(max(flush_bytes, timer.flush_bytes_for(l2)), device)
    return timer.EventClock(), _CONTEXT["flusher"]


def measure(req: dict) -> dict:
    """Samples of one (op, case, mode, dtype, provider); see the module docstring."""
    from . import runnable, timer  # lazy: the portable probe imports the revision under test on use

    torch = _setup()
    spec, case = _find(req["op"], req["case"])
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(req.get("dtype", "bf16"),
                                                                                        req.get("dtype", "bf16")))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(zlib.crc32(f"{spec.name}/{case.name}/{dtype}".encode()))
    inputs = spec.make_inputs(case, dtype, device, gen)
    run = runnable.prepare(_provider_fn(spec, req.get("provider", "wavefront")), inputs, req.get("mode", "fwd"), gen)
    clock, flusher = _clock_and_flush(torch, device, int(req.get("flush_bytes", 0)))
    t = timer.time_fn(run.call, clock=clock, reps=int(req.get("reps", timer.MIN_REPS)),
                      warmup=int(req.get("warmup", 3)), flush=flusher,
                      flush_label=flusher.label if flusher is not None else "none")
    return {"samples_us": list(t.samples_us), "method": t.method, "flush": t.flush, "device": str(device),
            "timing": "gpu" if device.type == "cuda" else "cpu-interpreter"}


def serve(stdin=sys.stdin, stdout=sys.stdout) -> None:
    for line in stdin:
        if not line.strip():
            continue
        try:
            answer = measure(json.loads(line))
        except Missing as exc:
            answer = {"error": str(exc), "missing": True}
        except Exception as exc:  # report and keep serving the other cases
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="probe", description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true")
    p.add_argument("--op")
    p.add_argument("--case")
    p.add_argument("--mode", default="fwd")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--provider", default="wavefront")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--flush-bytes", type=int, default=0)
    args = p.parse_args(argv)
    if args.serve:
        serve()
        return 0
    if not args.op or not args.case:
        p.error("--op and --case are required without --serve")
    try:
        answer = measure({"op": args.op, "case": args.case, "mode": args.mode, "dtype": args.dtype,
                          "provider": args.provider, "reps": args.reps, "warmup": args.warmup,
                          "flush_bytes": args.flush_bytes})
    except Missing as exc:
        print(json.dumps({"error": str(exc), "missing": True}))
        return EXIT_MISSING
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return EXIT_FAILED
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
