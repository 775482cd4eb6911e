"""The smoke check: one small call of every registered op, forward and backward, against the float64
reference, each under its own time limit, naming a failing or hanging op within seconds.

Meant as the first minute of a GPU run (``scripts/gpu_check.sh``): a kernel that faults, returns wrong
numbers or never returns shows up here, by name, before a long step spends its budget on it.

A hung GPU kernel cannot be interrupted from Python: the calling thread sits in a device synchronization.
So each op runs in a worker process that, before the call, appends a ``started`` line to the results file
(JSON lines, one ``os.write`` each, flushed to disk), and arms two watchdogs: a Python thread that, at the
op's limit, appends a ``timeout`` line and ends the process with ``os._exit`` (no cleanup that could wait on
the device), and ``faulthandler``'s C-level timer a few seconds later (it needs no interpreter lock, for a
call that holds it). The driver (:func:`run_smoke`) starts workers until every op has a final line or the
total budget is spent; a worker that died without writing one (a crash, the C timer, the driver's own
backstop) gets a line from the driver naming the op it had started. Each restart skips the ops already
done and the ones that hung. On a GPU a worker also ends after an op's error: a device fault leaves the
process's context unusable, and the next op deserves a clean one. The file is the partial result at every
moment; :func:`summarize` reads it.

Statuses: ``pass``; ``fail`` (an output or gradient past the accuracy bound, ``ops._spec.Tolerance``);
``error`` (an exception, e.g. an illegal address); ``timeout``; ``crashed`` (the process died, e.g. a
segmentation fault); ``not-run`` (the total budget ran out first).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a worker whose checks are planted (tests) starts without importing torch
    import torch

    from wavefront.ops._spec import Case, OpSpec

FINAL = ("pass", "fail", "error", "timeout", "crashed")
WATCHDOG_EXIT = 3  # the exit code of a worker its Python watchdog ended
RESTART_EXIT = 4  # a worker that ends itself after an op's error on a device (see run_worker)
_C_GRACE_S = 5.0  # faulthandler's timer fires this long after the Python watchdog should have


def smoke_case(spec: OpSpec) -> Case:
    """The op's smoke call: its first default (non-slow) case, the registry's plain representative."""
    for case in spec.cases:
        if not case.slow:
            return case
    raise ValueError(f"op {spec.name!r} has no default (non-slow) case to smoke")


def smoke_dtype(spec: OpSpec) -> torch.dtype:
    """bfloat16 where the op takes it (what training runs), else its first dtype."""
    import torch  # lazy: torch-free import

    return torch.bfloat16 if torch.bfloat16 in spec.dtypes else spec.dtypes[0]


def _append(path: Path, record: dict) -> None:
    """One JSON line, one write on an append-only descriptor, on disk before returning: concurrent workers
    interleave whole lines, and a process ended a moment later loses nothing it wrote."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: Path) -> list[dict]:
    """Every complete line of the results file (a line cut short by a killed process is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def final_status(records: Sequence[dict]) -> dict[str, dict]:
    """op -> its final record (the first one: a watchdog's timeout line is never followed by another)."""
    done: dict[str, dict] = {}
    for r in records:
        if r.get("status") in FINAL and r["op"] not in done:
            done[r["op"]] = r
    return done


def _check(spec: OpSpec, device: str) -> dict:
    import torch  # lazy: torch-free import

    from wavefront.workbench.bench.correctness import check_case  # lazy: torch-free worker

    case, dtype = smoke_case(spec), smoke_dtype(spec)
    res = check_case(spec, case, dtype, device)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()  # a kernel still running (or hung) is this op's, not the next one's
    record = {"op": spec.name, "case": case.name, "dtype": res.dtype, "wall_s": round(res.wall_s, 3)}
    if res.error is not None:
        return record | {"status": "error", "detail": res.error[:500]}
    worst = max(res.checks, key=lambda c: c.err_ours / c.bound if c.bound > 0 else float("inf"), default=None)
    record["checks"] = len(res.checks)
    record["modes"] = sorted({c.mode for c in res.checks})
    if worst is not None:
        record["detail"] = f"worst {worst.what} ({worst.mode}): err {worst.err_ours:.3g} vs bound {worst.bound:.3g}"
    return record | {"status": "pass" if res.passed else "fail"}


def run_worker(path: Path, ops: Sequence[str], device: str, timeout_s: float,
               specs: Mapping[str, Any] | None = None, check: Callable[[Any, str], dict] = _check) -> None:
    """Check each op in turn, appending to `path`; ops that already have a final line are skipped. At an
    op's limit the process ends (see the module docstring): the driver starts the next worker."""
    if specs is None:
        from wavefront.ops import REGISTRY as specs  # lazy: torch-free worker
    done = final_status(read_records(path))
    for name in ops:
        if name in done:
            continue
        _append(path, {"op": name, "status": "started", "pid": os.getpid(), "t": time.time()})
        finished = threading.Event()

        def watchdog(name: str = name, finished: threading.Event = finished) -> None:
            if not finished.wait(timeout_s):
                _append(path, {"op": name, "status": "timeout", "wall_s": timeout_s,
                               "detail": f"no result after {timeout_s:g} s: the process was ended (a hung kernel "
                                         "cannot be interrupted)"})
                os._exit(WATCHDOG_EXIT)

        threading.Thread(target=watchdog, daemon=True).start()
        faulthandler.dump_traceback_later(timeout_s + _C_GRACE_S, exit=True)
        t0 = time.perf_counter()
        try:
            record = check(specs[name], device)
        except Exception as exc:  # the op's own failure, reported; the next op runs
            record = {"op": name, "status": "error", "detail": f"{type(exc).__name__}: {exc}"[:500],
                      "wall_s": round(time.perf_counter() - t0, 3)}
        finished.set()
        faulthandler.cancel_dump_traceback_later()
        _append(path, record)
        if record["status"] == "error" and device != "cpu":
            # A device fault (illegal address, device-side assert) poisons the process's context: every later
            # op would fail the same way. The driver goes on in a fresh worker.
            os._exit(RESTART_EXIT)


@dataclass(frozen=True)
class SmokeSummary:
    """Every op's final record in registry order (``not-run`` where the budget ran out), and the counts."""

    records: tuple[dict, ...]
    wall_s: float
    workers: int

    @property
    def ok(self) -> bool:
        return all(r["status"] == "pass" for r in self.records)

    def count(self, status: str) -> int:
        return sum(r["status"] == status for r in self.records)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "wall_s": round(self.wall_s, 2), "workers": self.workers,
                "counts": {s: self.count(s) for s in (*FINAL, "not-run") if self.count(s)},
                "ops": list(self.records)}

    def table(self) -> str:
        lines = [f"{'op':24} {'status':8} {'wall_s':>7}  detail"]
        for r in self.records:
            wall = r.get("wall_s")
            lines.append(f"{r['op']:24} {r['status']:8} {'' if wall is None else f'{wall:7.2f}':>7}  "
                         f"{r.get('detail', '')}")
        counts = ", ".join(f"{n} {s}" for s, n in self.as_dict()["counts"].items())
        lines.append(f"smoke: {len(self.records)} ops, {counts}, {self.wall_s:.1f} s, {self.workers} worker(s)")
        return "\n".join(lines)


def summarize(path: Path, ops: Sequence[str], wall_s: float = 0.0, workers: int = 0) -> SmokeSummary:
    done = final_status(read_records(path))
    records = tuple(done.get(name, {"op": name, "status": "not-run", "detail": "the smoke budget ran out first"})
                    for name in ops)
    return SmokeSummary(records, wall_s, workers)


def _worker_command(path: Path, ops: Sequence[str], device: str, timeout_s: float) -> list[str]:
    return [sys.executable, "-m", "wavefront.workbench.bench.smoke", "--worker", "--results", str(path),
            "--device", device, "--timeout-s", str(timeout_s), *ops]


def run_smoke(path: Path, ops: Sequence[str] | None = None, *, device: str = "cuda", timeout_s: float = 20.0,
              budget_s: float = 55.0, jobs: int = 1,
              command: Callable[[Path, Sequence[str], str, float], list[str]] = _worker_command) -> SmokeSummary:
    """Run every op (the whole registry by default) in worker processes, `jobs` at a time, until each has a
    final line in `path` or `budget_s` is spent; see the module docstring. `command` builds a worker's
    command line (tests plant ops through it)."""
    if ops is None:
        from wavefront.ops import REGISTRY  # lazy: torch-free worker

        ops = list(REGISTRY)
    path = Path(path)
    t0 = time.monotonic()
    workers = 0
    while True:
        done = final_status(read_records(path))
        pending = [o for o in ops if o not in done]
        left = budget_s - (time.monotonic() - t0)
        if not pending or left <= 1.0:
            break
        shares = [pending[i::jobs] for i in range(min(jobs, len(pending)))]
        procs = [(subprocess.Popen(command(path, share, device, timeout_s), stdin=subprocess.DEVNULL), share)
                 for share in shares]
        workers += len(procs)
        deadline = time.monotonic() + left
        for proc, share in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:  # the budget's backstop: the op it was on is recorded below
                proc.kill()
                proc.wait()
            _record_death(path, proc, share, timeout_s)
        if len(final_status(read_records(path))) == len(done):  # no worker got anywhere: do not start more
            codes = sorted({proc.returncode for proc, _ in procs})
            for op in pending:
                _append(path, {"op": op, "status": "error", "detail": f"the worker process exited with code(s) "
                                                                      f"{codes} before running any op"})
    return summarize(path, ops, time.monotonic() - t0, workers)


def _record_death(path: Path, proc: subprocess.Popen, share: Sequence[str], timeout_s: float) -> None:
    """A worker that ended with an op started and no final line for it: say so, by name."""
    records = read_records(path)
    done = final_status(records)
    started = [r for r in records if r.get("status") == "started" and r.get("pid") == proc.pid and r["op"] in share]
    if not started or started[-1]["op"] in done:
        return
    op, waited = started[-1]["op"], time.time() - started[-1]["t"]
    status = "timeout" if waited >= timeout_s else "crashed"
    _append(path, {"op": op, "status": status, "wall_s": round(waited, 3),
                   "detail": f"the worker process ended with exit code {proc.returncode} during this op"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wavefront.workbench.bench.smoke",
                                     description="One small call of every registered op against the reference.")
    parser.add_argument("ops", nargs="*", help="registered op names (default: every op)")
    parser.add_argument("--results", required=True, type=Path, help="the JSON-lines results file (appended to)")
    parser.add_argument("--json", type=Path, help="write the summary document here")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--timeout-s", type=float, default=20.0, help="limit per op (compile included)")
    parser.add_argument("--budget-s", type=float, default=55.0, help="limit for all ops together")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes at a time")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from wavefront.ops import REGISTRY  # lazy: torch-free worker

    unknown = [o for o in args.ops if o not in REGISTRY]
    if unknown or args.timeout_s <= 0 or args.budget_s <= 0 or args.jobs < 1:
        what = (f"unknown op {unknown[0]!r}" if unknown else "--timeout-s and --budget-s must be > 0, --jobs >= 1")
        print(f"smoke: {what}", file=sys.stderr)
        return 2
    ops = args.ops or list(REGISTRY)
    if args.worker:
        run_worker(args.results, ops, args.device, args.timeout_s)
        return 0
    summary = run_smoke(args.results, ops, device=args.device, timeout_s=args.timeout_s, budget_s=args.budget_s,
                        jobs=args.jobs)
    print(summary.table())
    if args.json:
        args.json.write_text(json.dumps(summary.as_dict(), indent=1))
    return 0 if summary.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
