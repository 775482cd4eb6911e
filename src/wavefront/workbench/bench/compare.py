"""A/B comparison of two benchmark runs, or of two git revisions benchmarked in one invocation.

Per case (op, case, mode, dtype, provider) the speedup of B over A is the ratio of medians, with a
bootstrap 95% interval and a Mann-Whitney U p-value, and a verdict faster / slower / same / unknown
(wavefront.workbench.stats). For two revisions, each is checked out into a temporary worktree and timed
by a probe process of its own (probe.py); the probes are driven in interleaved rounds, A B B A ..., so
that drift (clocks, temperature, other tenants) lands on both sides alike.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from wavefront import runtime
from wavefront.ops import REGISTRY
from wavefront.workbench.bench import gitwork
from wavefront.workbench.bench.provenance import utc_now
from wavefront.workbench.bench.records import TIMING_CPU, TIMING_GPU, Measurement, RunInfo, StoredRun
from wavefront.workbench.bench.store import StoreError, open_run
from wavefront.workbench.document import encode
from wavefront.workbench.stats import Comparison, compare


@dataclass(frozen=True)
class CaseDelta:
    op: str
    case: str
    mode: str
    dtype: str
    provider: str
    comparison: Comparison | None
    note: str = ""

    @property
    def verdict(self) -> str:
        return self.comparison.verdict if self.comparison is not None else "unknown"

    @property
    def speedup(self) -> float | None:
        """How many times faster B is than A."""
        return self.comparison.speedup if self.comparison is not None else None

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        c = self.comparison
        if c is None or not math.isfinite(c.ci_low):
            return None
        return (1.0 / c.ci_high, 1.0 / c.ci_low)

    def as_dict(self) -> dict:
        ci = self.speedup_ci
        return {"op": self.op, "case": self.case, "mode": self.mode, "dtype": self.dtype, "provider": self.provider,
                "verdict": self.verdict, "speedup": self.speedup, "speedup_ci95": list(ci) if ci else None,
                "comparison": self.comparison.as_dict() if self.comparison else None, "note": self.note}


def compare_runs(a: StoredRun, b: StoredRun, *, providers: Sequence[str] | None = None, alpha: float = 0.01,
                 equivalence: float = 0.05) -> list[CaseDelta]:
    """Every case present in A or B, matched by key; see the module docstring."""
    ma, mb = a.by_key(), b.by_key()
    keys = list(ma) + [k for k in mb if k not in ma]
    out = []
    for key in keys:
        if providers is not None and key[4] not in providers:
            continue
        x, y = ma.get(key), mb.get(key)
        if x is None or y is None:
            out.append(CaseDelta(*key, None, "only in B" if x is None else "only in A"))
        elif not x.ok or not y.ok:
            out.append(CaseDelta(*key, None, f"no samples: A {x.status}, B {y.status}"))
        else:
            out.append(CaseDelta(*key, compare(x.samples_us, y.samples_us, alpha=alpha, equivalence=equivalence)))
    return out


def comparability_notes(a: StoredRun, b: StoredRun) -> list[str]:
    """Why two runs' timings may not be comparable (different devices, CPU timings)."""
    notes = []
    if a.info.device_name != b.info.device_name:
        notes.append(f"different devices: A ran on {a.info.device_name}, B on {b.info.device_name}")
    if TIMING_CPU in (a.info.timing, b.info.timing):
        notes.append("CPU interpreter: not a performance figure")
    return notes


def verdict_counts(deltas: Sequence[CaseDelta]) -> dict[str, int]:
    out = {"faster": 0, "slower": 0, "same": 0, "unknown": 0}
    for d in deltas:
        out[d.verdict] += 1
    return out


@dataclass(frozen=True)
class ProbeCase:
    op: str
    case: str
    mode: str = "fwd"
    dtype: str = "bf16"
    provider: str = "wavefront"

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.op, self.case, self.mode, self.dtype, self.provider)


class _Probe:
    """A probe server in a worktree of one revision."""

    def __init__(self, probe_dir: Path, worktree: Path):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(probe_dir), str(worktree / "src")]))
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the idle probe must not spin on the cores the other uses
        self.proc = subprocess.Popen([sys.executable, "-m", f"{gitwork.PROBE_PACKAGE}.probe", "--serve"],
                                     cwd=worktree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def ask(self, request: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"the probe exited (code {self.proc.poll()})"}
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def compare_revisions(repo: str | Path, rev_a: str, rev_b: str, cases: Sequence[ProbeCase], *, rounds: int = 6,
                      reps_per_round: int = 10, progress: Callable[[int, int, str], None] | None = None,
                      flush_bytes: int = 0) -> tuple[StoredRun, StoredRun, list[CaseDelta]]:
    """Benchmark `cases` at two revisions of `repo` in interleaved rounds; returns both runs and the deltas."""
    if rounds < 1 or reps_per_round < 1:
        raise ValueError(f"rounds and reps_per_round must be >= 1; got {rounds}, {reps_per_round}")
    if not cases:
        raise ValueError("compare_revisions needs at least one case")
    shas = [gitwork.rev_parse(repo, r) for r in (rev_a, rev_b)]
    samples: list[dict[tuple, list[float]]] = [{c.key: [] for c in cases}, {c.key: [] for c in cases}]
    errors: list[dict[tuple, str]] = [{}, {}]
    timing = TIMING_CPU
    with tempfile.TemporaryDirectory(prefix="wavefront-compare-") as tmp:
        tmp_path = Path(tmp)
        probe_dir = gitwork.install_probe(tmp_path / "probe")
        with gitwork.temp_worktree(repo, shas[0], tmp_path / "a") as wa, \
                gitwork.temp_worktree(repo, shas[1], tmp_path / "b") as wb:
            probes = [_Probe(probe_dir, wa), _Probe(probe_dir, wb)]
            try:
                total, done = rounds * len(cases) * 2, 0
                for r in range(rounds):
                    order = (0, 1) if r % 2 == 0 else (1, 0)  # A B, then B A: no side always goes first
                    for case in cases:
                        for side in order:
                            if case.key in errors[side]:
                                done += 1
                                continue
                            ans = probes[side].ask({"op": case.op, "case": case.case, "mode": case.mode,
                                                    "dtype": case.dtype, "provider": case.provider,
                                                    "reps": reps_per_round, "warmup": 3 if r == 0 else 1,
                                                    "flush_bytes": flush_bytes})
                            if "error" in ans:
                                errors[side][case.key] = ans["error"]
                            else:
                                samples[side][case.key].extend(ans["samples_us"])
                                timing = TIMING_GPU if ans.get("timing") == "gpu" else TIMING_CPU
                            done += 1
                            if progress:
                                progress(done, total, f"round {r + 1}/{rounds} {'AB'[side]} {case.op}/{case.case}")
            finally:
                for p in probes:
                    p.close()
    runs = []
    env = _environment()
    for side, (rev, sha) in enumerate(zip((rev_a, rev_b), shas, strict=True)):
        info = RunInfo(created_utc=utc_now(), label=rev, git_sha=sha, git_dirty=False,
                       device_name=_device_name(timing), timing=timing,
                       extra={"source": "compare --git", "rounds": rounds, "reps_per_round": reps_per_round}, **env)
        meas = []
        for c in cases:
            err = errors[side].get(c.key)
            meas.append(Measurement(*c.key, status="error" if err else "ok", reason=err or "",
                                    samples_us=[] if err else samples[side][c.key], method="probe"))
        runs.append(StoredRun(info, meas))
    return runs[0], runs[1], compare_runs(runs[0], runs[1])


def _environment() -> dict[str, str | None]:
    """The probes run this interpreter: its torch, triton, python and host describe both sides."""
    d = runtime.describe("cpu")
    b = runtime.backend()
    return {"arch": runtime.arch().name, "backend": b, "torch": d["torch"], "triton": d["triton"],
            "python": d["python"], "host": d["host"]}


def _device_name(timing: str) -> str:
    if timing != TIMING_GPU:
        return "cpu"
    import torch  # lazy: torch-free import

    return torch.cuda.get_device_name()


# ---------------------------------------------------------------------------------------------------
# The job behind `wavefront compare`.

SCHEMA = "wavefront.compare/1"


@dataclass(frozen=True)
class CompareRequest:
    """Two stored runs (references as :func:`~wavefront.workbench.bench.store.open_run` reads them), or
    with ``git=True`` two revisions of `repo` benchmarked now, interleaved."""

    run_a: str
    run_b: str
    git: bool = False
    ops: tuple[str, ...] = ()  # with git: ops to time (() = all)
    cases: tuple[str, ...] = ()  # with git: case names (() = each op's bench cases on a GPU, 'npow2' on CPU)
    modes: tuple[str, ...] = ()  # with git: () = fwd
    providers: tuple[str, ...] = ()  # () = every provider in the runs (with git: wavefront)
    rounds: int = 6
    reps_per_round: int = 10
    repo: str = "."
    store: str = "wavefront-results.sqlite"


@dataclass
class CompareResult:
    SCHEMA: ClassVar[str] = SCHEMA

    request: CompareRequest
    a: StoredRun
    b: StoredRun
    deltas: list[CaseDelta]
    notes: list[str]

    @property
    def counts(self) -> dict[str, int]:
        return verdict_counts(self.deltas)

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "a": encode(self.a.info), "b": encode(self.b.info), "notes": self.notes,
                "counts": self.counts, "cases": [d.as_dict() for d in self.deltas]}


def empty_notes(a: StoredRun, b: StoredRun) -> list[str]:
    """Why two runs give nothing to compare: a run without timings (a CPU `wavefront bench` times nothing
    unless --cpu-timing), or no case in common."""
    untimed = [name for name, r in (("A", a), ("B", b)) if not r.measurements]
    if untimed:
        which = "runs A and B hold" if len(untimed) == 2 else f"run {untimed[0]} holds"
        return [f"nothing to compare: {which} no timings (only correctness rows; `wavefront bench` times on a "
                "GPU, or on a CPU with --cpu-timing)"]
    return ["nothing to compare: the runs share no case (op, case, mode, dtype, provider)"]


def probe_cases(request: CompareRequest, on_gpu: bool) -> list[ProbeCase]:
    for name in request.ops:
        if name not in REGISTRY:
            raise ValueError(f"unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    out = []
    for name in request.ops or REGISTRY:
        spec = REGISTRY[name]
        names = request.cases or ([c.name for c in spec.bench_cases] if on_gpu else ["npow2"])
        out += [ProbeCase(name, c, m, "bf16", p) for c in names for m in request.modes or ("fwd",)
                for p in request.providers or ("wavefront",)]
    return out


def run(request: CompareRequest, progress: Callable[[int, int, str], None] | None = None) -> CompareResult:
    """Compare two runs or two revisions. Raises StoreError / GitError / ValueError on bad input."""
    if request.git:
        import torch  # lazy: torch-free import

        a, b, deltas = compare_revisions(request.repo, request.run_a, request.run_b,
                                         probe_cases(request, torch.cuda.is_available()), rounds=request.rounds,
                                         reps_per_round=request.reps_per_round, progress=progress)
    else:
        try:
            a, b = open_run(request.run_a, request.store), open_run(request.run_b, request.store)
        except (sqlite3.Error, StoreError) as exc:  # a directory, a locked, damaged or foreign file
            raise StoreError(f"--store: cannot read the runs ({request.run_a}, {request.run_b}) from "
                             f"{request.store}: {exc}") from None
        deltas = compare_runs(a, b, providers=request.providers or None)
    notes = comparability_notes(a, b) + ([] if deltas else empty_notes(a, b))
    return CompareResult(request, a, b, deltas, notes)
