"""``wavefront bench --profile ncu|nsys|rocprof``: the chosen cases run once more under a vendor profiler,
its files kept beside the results and read back by wavefront's own readers.

The profiled run is a child ``python -m wavefront bench`` with the same case selection (op, case, mode,
provider, dtype), timing only, nothing stored, no dashboard, no static sections, under:

- ``nsys``: ``nsys profile --trace=cuda,nvtx`` to ``bench_nsys.nsys-rep``, then ``nsys export --type=sqlite``
  to ``bench_nsys.sqlite``, which ``trace analyze`` reads (the analysis is written as
  ``bench_nsys.trace.json``);
- ``rocprof``: ``rocprofv3 --runtime-trace --output-format csv`` into ``rocprof/``, whose
  ``*_kernel_trace.csv`` ``trace analyze`` reads (``bench_rocprof.trace.json``);
- ``ncu``: ``ncu --set full`` to ``bench_ncu.ncu-rep`` plus its raw-page CSV (``ncu --import ... --csv
  --page raw``) as ``bench_ncu_raw.csv``, for ``wavefront counters``; every launch is replayed once per
  counter pass, so this run times one repetition after one warm-up.

The tool must be on PATH and torch must see a GPU (CUDA for nsys/ncu, ROCm for rocprof); otherwise
:class:`RequestError` says which, before anything runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from wavefront.workbench.jobs.request import RequestError
from wavefront.workbench.trace import analyze as trace_analyze

SCHEMA = "wavefront.bench.profile/1"
PROFILERS = ("ncu", "nsys", "rocprof")
EXECUTABLES = {"ncu": "ncu", "nsys": "nsys", "rocprof": "rocprofv3"}
#: The child bench: timing only, nothing kept but the profile.
CHILD_OPTIONS = ("--skip-correctness", "--no-store", "--no-report", "--inspect-targets", "none", "--no-traffic")

Runner = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class ProfileRequest:
    tool: str  # one of PROFILERS
    out_dir: str  # where the profile files go
    selection: tuple[str, ...] = ()  # the child bench's case options (--op X --case Y ...)
    device: str = "cuda"


@dataclass
class ProfileResult:
    """What ran and what it left; ``as_dict()`` is the ``wavefront.bench.profile/1`` document."""

    SCHEMA: ClassVar[str] = SCHEMA

    tool: str
    commands: list[list[str]]
    files: list[str]
    analysis: str | None = None  # the trace-analysis document written from the profile (nsys, rocprof)
    next_steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "tool": self.tool, "commands": self.commands, "files": self.files,
                "analysis": self.analysis, "next_steps": self.next_steps}


def selection(op: Sequence[str] = (), mode: Sequence[str] = (), provider: Sequence[str] = (),
              dtype: Sequence[str] = (), case: Sequence[str] = ()) -> tuple[str, ...]:
    """The ``wavefront bench`` options choosing these cases (each value repeats its option)."""
    pairs = [(f"--{name}", v) for name, vals in (("op", op), ("mode", mode), ("provider", provider),
                                                  ("dtype", dtype), ("case", case)) for v in vals]
    return tuple(x for pair in pairs for x in pair)


def child_bench(selection: Sequence[str], tool: str) -> list[str]:
    """The profiled process: this interpreter running ``wavefront bench`` on the selection."""
    reps = ("--reps", "1", "--warmup", "1") if tool == "ncu" else ()
    return [sys.executable, "-m", "wavefront", "bench", *CHILD_OPTIONS, *reps, *selection]


def profile_commands(tool: str, exe: str, out_dir: Path, child: Sequence[str]) -> list[list[str]]:
    """The command lines that profile ``child`` with ``tool`` (``exe``: its path) into ``out_dir``."""
    if tool == "nsys":
        rep = out_dir / "bench_nsys"
        # nsys takes its long options as --name=value (its user guide)
        return [[exe, "profile", "--trace=cuda,nvtx", "--force-overwrite=true", f"--output={rep}", *child],
                [exe, "export", "--type=sqlite", "--force-overwrite=true", f"--output={out_dir / 'bench_nsys.sqlite'}",
                 f"{rep}.nsys-rep"]]
    if tool == "ncu":
        rep = out_dir / "bench_ncu"
        return [[exe, "--set", "full", "--target-processes", "all", "--force-overwrite", "--export", str(rep),
                 *child],
                [exe, "--import", f"{rep}.ncu-rep", "--csv", "--page", "raw"]]
    if tool == "rocprof":
        return [[exe, "--runtime-trace", "--output-format", "csv", "--output-directory", str(out_dir / "rocprof"),
                 "--output-file", "bench", "--", *child]]
    raise RequestError("profile", f"expected one of {', '.join(PROFILERS)}; got {tool!r}")


def check_can_profile(tool: str, device: str = "cuda") -> str:
    """The tool's executable path; RequestError when it is not on PATH or there is no GPU to profile."""
    if tool not in PROFILERS:
        raise RequestError("profile", f"expected one of {', '.join(PROFILERS)}; got {tool!r}")
    exe = shutil.which(EXECUTABLES[tool])
    if exe is None:
        raise RequestError("profile", f"{tool}: {EXECUTABLES[tool]} is not on PATH (install it, or put it on PATH, "
                                      "to profile; without it, drop --profile)")
    rocm = torch.version.hip is not None
    if device == "cpu" or not torch.cuda.is_available() or (tool == "rocprof") != rocm:
        want = "a ROCm GPU" if tool == "rocprof" else "an NVIDIA GPU"
        raise RequestError("profile", f"{tool} profiles {want}, and torch sees none on this machine")
    return exe


def run_profile(request: ProfileRequest, *, runner: Runner = subprocess.run, exe: str | None = None,
                analyze: Callable | None = None) -> ProfileResult:
    """Profile the selection (see the module docstring). ``exe`` skips the PATH and GPU checks (tests);
    ``runner`` runs a command line (``subprocess.run``'s signature); ``analyze(paths) -> document``
    reads the timeline (default: ``trace analyze``)."""
    exe = exe or check_can_profile(request.tool, request.device)
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    commands = profile_commands(request.tool, exe, out, child_bench(request.selection, request.tool))
    for n, cmd in enumerate(commands):
        capture = request.tool == "ncu" and n == 1  # the raw page goes to a file
        done = runner(cmd, capture_output=capture, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0]).name} exited with status {done.returncode}: {' '.join(cmd[:4])} ...")
        if capture:
            (out / "bench_ncu_raw.csv").write_text(done.stdout)
    files = sorted(str(p) for p in out.rglob("*") if p.is_file())
    result = ProfileResult(request.tool, commands, files)
    if request.tool == "ncu":
        result.next_steps.append(f"wavefront counters {out / 'bench_ncu.ncu-rep'}  (or {out / 'bench_ncu_raw.csv'} "
                                 "without the ncu-report package)")
        return result
    timeline = ([out / "bench_nsys.sqlite"] if request.tool == "nsys"
                else sorted((out / "rocprof").rglob("*kernel_trace.csv")))
    if not timeline or not timeline[0].is_file():
        raise RuntimeError(f"{request.tool} left no timeline in {out} (expected "
                           f"{'bench_nsys.sqlite' if request.tool == 'nsys' else 'rocprof/**/*_kernel_trace.csv'})")
    if analyze is None:
        def analyze(paths):
            return trace_analyze(paths).as_dict()

    doc_path = out / f"bench_{request.tool}.trace.json"
    doc_path.write_text(json.dumps(analyze([str(p) for p in timeline]), indent=1))
    result.analysis = str(doc_path)
    result.files.append(str(doc_path))
    result.next_steps.append(f"wavefront trace analyze {' '.join(map(str, timeline))}")
    return result
