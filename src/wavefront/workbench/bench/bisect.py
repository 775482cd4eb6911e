"""Find the commit that made a case slower: ``git bisect run`` with the dynamic gate as the test.

The check is pluggable: a :class:`MeasureCommand` is any command that, run in a checkout of a commit,
prints duration samples on its last stdout line (a JSON list, ``{"samples_us": [...]}``, or numbers
separated by spaces). :func:`op_command` builds the default one, the portable probe timing one op of the
checked-out revision (probe.py). ``{worktree}`` and ``{probe}`` in the command and its environment expand
to the checkout and the probe's directory.

:func:`bisect` measures the good revision once (the baseline samples), confirms that the bad one is a
regression by the gate's rule (regress.is_regression: slower than both the threshold and the noise band,
and the A/B test agrees), then runs ``git bisect run`` in a temporary worktree, so the user's checkout is
never touched. At each commit, ``python -m wavefront.workbench.bench.bisect CONFIG`` (this module, from
the wavefront that started the bisection) measures and exits 0 (good), 1 (bad) or 125 (cannot measure
this commit: skip). Every step is logged with its median and ratio.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from wavefront.ops import REGISTRY
from wavefront.workbench.bench import gitwork
from wavefront.workbench.bench.regress import DEFAULT_THRESHOLD, is_regression
from wavefront.workbench.document import encode, encode_fields

EXIT_GOOD, EXIT_BAD, EXIT_SKIP = 0, 1, 125
SCHEMA = "wavefront.bisect/1"


class MeasureError(RuntimeError):
    pass


def parse_samples(stdout: str) -> list[float]:
    """Samples from the last non-empty line of `stdout` (see the module docstring)."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise MeasureError("the measure command printed nothing")
    last = lines[-1]
    try:
        value = json.loads(last)
    except json.JSONDecodeError:
        value = last.split()
    if isinstance(value, dict):
        if "error" in value:
            raise MeasureError(str(value["error"]))
        value = value.get("samples_us", [])
    if isinstance(value, int | float):
        value = [value]
    try:
        samples = [float(v) for v in value]
    except (TypeError, ValueError):
        raise MeasureError(f"cannot read samples from the line {last[:200]!r}") from None
    if not samples or any(not (s > 0) for s in samples):
        raise MeasureError(f"the measure command gave no positive samples: {last[:200]!r}")
    return samples


@dataclass(frozen=True)
class MeasureCommand:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    probe: bool = False  # needs the portable probe installed next to it
    timeout_s: float = 600.0

    def measure(self, worktree: Path, probe_dir: Path | None = None) -> list[float]:
        subs = {"worktree": str(worktree), "probe": str(probe_dir or "")}
        argv = [a.format(**subs) for a in self.argv]
        env = dict(os.environ) | {k: v.format(**subs) for k, v in self.env.items()}
        try:
            proc = subprocess.run(argv, cwd=worktree, env=env, capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise MeasureError(f"the measure command ran past {self.timeout_s:.0f} s") from None
        except OSError as exc:
            raise MeasureError(f"cannot run {argv[0]!r}: {exc}") from None
        if proc.returncode != 0:
            tail = (proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines() or [""])[-1]
            raise MeasureError(f"the measure command exited {proc.returncode}: {tail[:300]}")
        return parse_samples(proc.stdout)


def shell_command(cmd: str, timeout_s: float = 600.0) -> MeasureCommand:
    """A user's measure command, run by the shell in the checkout."""
    return MeasureCommand(("/bin/sh", "-c", cmd), timeout_s=timeout_s)


def op_command(op: str, case: str, mode: str = "fwd", dtype: str = "bf16", provider: str = "wavefront",
               reps: int = 30) -> MeasureCommand:
    """Time one op of the checked-out revision with the portable probe."""
    return MeasureCommand((sys.executable, "-m", f"{gitwork.PROBE_PACKAGE}.probe", "--op", op, "--case", case,
                           "--mode", mode, "--dtype", dtype, "--provider", provider, "--reps", str(reps)),
                          env={"PYTHONPATH": os.pathsep.join(["{probe}", "{worktree}/src"])}, probe=True)


@dataclass
class BisectStep:
    sha: str
    verdict: str  # "good" | "bad" | "skip"
    median_us: float | None = None
    ratio: float | None = None
    note: str = ""


@dataclass
class BisectResult:
    SCHEMA: ClassVar[str] = SCHEMA

    found: bool
    first_bad: str | None
    subject: str | None
    good: str
    bad: str
    baseline_median_us: float | None
    bad_median_us: float | None
    steps: list[BisectStep]
    message: str
    log: str = ""

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, **encode_fields(self)}

    @property
    def exit_code(self) -> int:
        return 0 if self.found else 1


def _write_config(path: Path, command: MeasureCommand, baseline: Sequence[float], threshold: float,
                  probe_dir: Path | None, log_path: Path) -> None:
    path.write_text(json.dumps({"command": encode(command), "baseline_samples": list(baseline),
                                "threshold": threshold, "probe_dir": str(probe_dir) if probe_dir else None,
                                "log": str(log_path)}))


def check_commit(config_path: str | Path, worktree: str | Path = ".") -> int:
    """One step of `git bisect run`: measure the checkout, judge it against the baseline, log it."""
    cfg = json.loads(Path(config_path).read_text())
    cmd_d = cfg["command"]
    command = MeasureCommand(tuple(cmd_d["argv"]), dict(cmd_d["env"]), cmd_d["probe"], cmd_d["timeout_s"])
    wt = Path(worktree).resolve()
    sha = gitwork.git(wt, "rev-parse", "HEAD").stdout.strip()
    try:
        samples = command.measure(wt, Path(cfg["probe_dir"]) if cfg["probe_dir"] else None)
    except MeasureError as exc:
        step, code = BisectStep(sha, "skip", note=str(exc)), EXIT_SKIP
    else:
        bad, _, ratio, _ = is_regression(cfg["baseline_samples"], samples, cfg["threshold"])
        step = BisectStep(sha, "bad" if bad else "good", sorted(samples)[len(samples) // 2], ratio)
        code = EXIT_BAD if bad else EXIT_GOOD
    with open(cfg["log"], "a") as fh:
        fh.write(json.dumps(asdict(step)) + "\n")
    return code


_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.MULTILINE)


def bisect(repo: str | Path, good: str, bad: str, command: MeasureCommand, *,
           threshold: float = DEFAULT_THRESHOLD, progress: Callable[[str], None] | None = None) -> BisectResult:
    """Find the first commit between `good` and `bad` where `command` regresses; see the module docstring."""
    say = progress or (lambda msg: None)
    repo = Path(repo).resolve()
    good_sha, bad_sha = gitwork.rev_parse(repo, good), gitwork.rev_parse(repo, bad)
    anc = gitwork.git(repo, "merge-base", "--is-ancestor", good_sha, bad_sha, check=False)
    if anc.returncode != 0:
        raise ValueError(f"--good {good} is not an ancestor of --bad {bad}")
    with tempfile.TemporaryDirectory(prefix="wavefront-bisect-") as tmp:
        tmp_path = Path(tmp)
        probe_dir = gitwork.install_probe(tmp_path / "probe") if command.probe else None
        log_path = tmp_path / "steps.jsonl"
        with gitwork.temp_worktree(repo, good_sha, tmp_path / "wt") as wt:
            say(f"measuring good {good_sha[:10]}")
            try:
                baseline = command.measure(wt, probe_dir)
            except MeasureError as exc:
                raise MeasureError(f"cannot measure the good revision {good}: {exc}") from None
            gitwork.git(wt, "checkout", "--detach", "--force", bad_sha)
            say(f"measuring bad {bad_sha[:10]}")
            try:
                bad_samples = command.measure(wt, probe_dir)
            except MeasureError as exc:
                raise MeasureError(f"cannot measure the bad revision {bad}: {exc}") from None
            regressed, _, ratio, band = is_regression(baseline, bad_samples, threshold)
            med = lambda s: sorted(s)[len(s) // 2]  # noqa: E731
            if not regressed:
                return BisectResult(False, None, None, good_sha, bad_sha, med(baseline), med(bad_samples), [],
                                    f"{bad} is not a regression of {good}: ratio {ratio:.3f} within "
                                    f"max({threshold:.0%}, noise {band:.1%}) or not significant")
            config = tmp_path / "check.json"
            _write_config(config, command, baseline, threshold, probe_dir, log_path)
            say(f"bisecting {good_sha[:10]}..{bad_sha[:10]} (bad is {ratio - 1:+.1%})")
            try:
                gitwork.git(wt, "bisect", "start", bad_sha, good_sha)
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")]))
                run = subprocess.run(["git", "bisect", "run", sys.executable, "-m", "wavefront.workbench.bench.bisect",
                                      str(config)], cwd=wt, env=env, capture_output=True, text=True,
                                     timeout=24 * 3600)
                log = gitwork.git(wt, "bisect", "log", check=False).stdout
            finally:
                gitwork.git(wt, "bisect", "reset", check=False)
        steps = [BisectStep(**json.loads(ln)) for ln in log_path.read_text().splitlines()] if log_path.exists() else []
    m = _FIRST_BAD.search(run.stdout)
    if m is None:
        return BisectResult(False, None, None, good_sha, bad_sha, med(baseline), med(bad_samples), steps,
                            "git bisect did not single out a commit (skipped commits?): "
                            + (run.stdout.strip().splitlines() or ["no output"])[-1], log)
    first = m.group(1)
    return BisectResult(True, first, gitwork.subject(repo, first), good_sha, bad_sha, med(baseline),
                        med(bad_samples), steps, f"first bad commit {first[:10]}", log)


@dataclass(frozen=True)
class BisectRequest:
    """What ``wavefront bisect`` asks: the op to time (or a shell `command`) between `good` and `bad`."""

    good: str
    bad: str
    op: str | None = None
    case: str | None = None  # default: the op's first bench case on a GPU, 'npow2' on CPU
    mode: str = "fwd"
    dtype: str = "bf16"
    provider: str = "wavefront"
    reps: int = 30
    command: str | None = None
    threshold: float = DEFAULT_THRESHOLD
    repo: str = "."

    def measure_command(self) -> MeasureCommand:
        """The check to run at each commit; ValueError when the request is inconsistent."""
        if (self.op is None) == (self.command is None):
            raise ValueError("give exactly one of --op NAME or --command CMD")
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0; got {self.threshold}")
        if self.command is not None:
            return shell_command(self.command)
        import torch  # lazy: torch-free import

        if self.op not in REGISTRY:
            raise ValueError(f"--op: unknown op {self.op!r}; registered ops: {', '.join(sorted(REGISTRY))}")
        case = self.case or (REGISTRY[self.op].bench_cases[0].name if torch.cuda.is_available() else "npow2")
        return op_command(self.op, case, self.mode, self.dtype, self.provider, self.reps)


def run(request: BisectRequest, progress: Callable[[str], None] | None = None) -> BisectResult:
    """Bisect as the request says (see :func:`bisect`). Raises ValueError, GitError or MeasureError."""
    return bisect(request.repo, request.good, request.bad, request.measure_command(), threshold=request.threshold,
                  progress=progress)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m wavefront.workbench.bench.bisect CHECK_CONFIG.json", file=sys.stderr)
        return 128  # git bisect run aborts on codes above 127
    return check_commit(args[0])


if __name__ == "__main__":
    sys.exit(main())
