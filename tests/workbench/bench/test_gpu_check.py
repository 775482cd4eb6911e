"""scripts/gpu_check.sh --dry-run: the plan a lent GPU would run, and its provenance file, without a GPU."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_dry_run_plans_tests_peers_bench_and_training(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=shutil.which("python") or "python3")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    logs = list(tmp_path.glob("bench_dryrun_*.log"))
    metas = list(tmp_path.glob("bench_dryrun_*.meta.json"))
    assert len(logs) == 1 and len(metas) == 1
    stem = str(logs[0])[: -len(".log")]
    log = logs[0].read_text()
    assert "-m pytest -q -x -p no:cacheprovider -n 0 tests/ops" in log
    # Peers: attention against SDPA's flash and cuDNN backends and flash-attn, linear's rule against the vendor.
    peers = next(line for line in log.splitlines() if "--op attention --op linear" in line)
    for provider in ("wavefront", "eager", "vendor", "sdpa_flash", "sdpa_cudnn", "flash_attn"):
        assert f"--provider {provider} " in peers
    assert f"--budget-s 35 --store {stem}.sqlite --no-report --json {stem}.peers.json" in peers
    # Every other registered op in the general bench, each exactly once; attention and linear not again.
    from wavefront.ops import REGISTRY

    bench = next(line for line in log.splitlines() if f"--json {stem}.json" in line)
    ops = bench.split("--op ")[1:]
    assert sorted(o.split()[0] for o in ops) == sorted(n for n in REGISTRY if n not in ("attention", "linear"))
    assert "--provider liger" in bench and "--provider quack" in bench and f"--store {stem}.sqlite" in bench
    _assert_verb_parses(bench.split("-m wavefront ", 1)[1].split(" --label ", 1)[0])
    # quack-kernels is installed from carried wheels like the other optional peers.
    assert "optional peers: Liger-Kernel, flash-attn, quack-kernels" in log
    train = next(line for line in log.splitlines() if "-m wavefront train" in line)
    assert "--compare eager,compile,liger,wavefront --model llama3-8b" in train and f"{stem}.train.json" in train
    _assert_verb_parses(train.split("-m wavefront ", 1)[1])
    assert f"--export-json {stem}.results.json" in log
    # Every step that runs has a time limit, and the limits add up to less than 8 minutes with 30 s to spare
    # for what runs outside a step (provenance).
    commands = [line for line in log.splitlines() if line.startswith("+ ")]
    assert all(line.startswith("+ timeout -k 5 ") for line in commands)
    limits = [int(line.split()[4]) for line in commands]
    assert len(limits) == 12 and sum(limits) < 8 * 60 - 30
    # Right after the smoke step, a few cases profiled under nsys (rocprofv3 on ROCm) and ncu, files under $OUT.
    timeline = "rocprof" if __import__("torch").version.hip else "nsys"
    for tool, at in ((timeline, 1), ("ncu", 2)):
        line = commands[at]
        assert f"--profile {tool} " in line and f"--profile-dir {stem}.profile/{tool}" in line and limits[at] <= 30
        _assert_verb_parses(line.split("-m wavefront ", 1)[1])
    # The smoke step comes first, under a minute, every op with its own limit.
    smoke = commands[0]
    assert "-m wavefront.workbench.bench.smoke" in smoke and limits[0] <= 60
    from wavefront.workbench.bench.smoke import build_parser

    args = build_parser().parse_args(shlex.split(smoke.split("wavefront.workbench.bench.smoke", 1)[1]))
    assert args.ops == [] and args.device == "cuda" and args.json == Path(f"{stem}.smoke.json")
    assert 0 < args.timeout_s < args.budget_s < limits[0] and args.jobs > 1
    gluon_at = next(i for i, line in enumerate(commands) if "gluon.json" in line)
    gluon = commands[gluon_at]
    assert f"{stem}.gluon.json" in gluon  # the opt-in Gluon attention forward, checked and timed on sm_90
    assert gluon_at > 0 and limits[gluon_at] >= 20
    # It runs at least 8 key blocks (the old schedule hung past 2), and a short sequence first.
    seqs = [int(a) for a in gluon.split(".gluon.json", 1)[1].split()]
    assert max(-(-s // 128) for s in seqs) >= 8 and min(seqs) <= 128 and seqs == sorted(seqs)
    # Each step's record, and the summary table at the end.
    records = [json.loads(line) for line in Path(f"{stem}.steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == ["smoke", "profile-timeline", "profile-ncu", "tests", "peers", "bench",
                                            "train", "gluon", "fa3", "fp8-tma-tests", "fp8-tma-bench", "report"]
    fa3 = commands[gluon_at + 1]  # the FA3-schedule forward: its own script and limit, the same sequences
    assert f"scripts/gpu_check_fa3.py {stem}.fa3.json" in fa3 and fa3.split(".fa3.json", 1)[1] == \
        gluon.split(".gluon.json", 1)[1]
    # The opt-in FP8 TMA GEMM (sm_90/sm_100; skipped elsewhere): its float64 accuracy tests with the flag, every
    # recipe on the ragged three-K-block shape, then linear_fp8's forward benched with the flag.
    fp8_tests, fp8_bench = commands[gluon_at + 2], commands[gluon_at + 3]
    assert "env WAVEFRONT_FP8_TMA=1 " in fp8_tests and "tests/ops/test_linear_fp8_tma.py" in fp8_tests
    k = fp8_tests.rsplit(" -k ", 1)[1]
    assert sorted(_selected(ROOT / "tests" / "ops" / "test_linear_fp8_tma.py", k)) == sorted(
        f"test_tma_kernel_matches_float64_and_the_cp_async_kernel[70-36-272-True-{r}]"
        for r in ("tensorwise", "rowwise", "blockwise", "blockwise_dw", "mxfp8"))
    assert "env WAVEFRONT_FP8_TMA=1 " in fp8_bench and f"--json {stem}.fp8-tma.json" in fp8_bench
    _assert_verb_parses(fp8_bench.split("-m wavefront ", 1)[1].split(" --label ", 1)[0])
    assert "--op linear_fp8 --mode fwd --provider wavefront" in fp8_bench
    assert {r["status"] for r in records} == {"planned"}
    assert "== summary" in proc.stdout and log.rstrip().endswith(f"report     planned      0       0      {limits[-1]}")
    meta = json.loads(metas[0].read_text())
    assert meta["dry_run"] is True and meta["torch"] and meta["runtime"]["backend"]
    assert "flash_attn" in meta and "liger_kernel" in meta
    assert meta["date_utc"].endswith("Z") and "git_sha" in meta
    assert not list(tmp_path.glob("*.sqlite"))  # nothing ran


def test_unknown_argument_is_one_clear_line(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--bogus"], cwd=ROOT,
                          env=dict(os.environ, OUT=str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--bogus" in proc.stderr


def _selected(path: Path, keyword: str) -> list[str]:
    """The test ids of `path`'s parametrized tests that pytest's ``-k keyword`` selects (pytest's own expression
    parser; a name matches when it contains the identifier, case-insensitively, as pytest matches item names),
    without a second pytest process."""
    import importlib.util
    import itertools

    from _pytest.mark.expression import Expression

    spec = importlib.util.spec_from_file_location("_gpu_check_selected", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ids = []
    for name, fn in vars(module).items():
        if not name.startswith("test_"):
            continue
        marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
        # The decorator nearest the function is applied first and its values come first in the id.
        values = [[v if isinstance(v, tuple) else (v,) for v in m.args[1]] for m in marks]
        combos = itertools.product(*values) if values else [()]
        ids += [name + ("[" + "-".join(str(x) for part in combo for x in part) + "]" if values else "")
                for combo in combos]
    expr = Expression.compile(keyword)
    return [i for i in ids if expr.evaluate(lambda ident, _id=i, **_: ident.lower() in _id.lower())]


def _assert_verb_parses(command_line: str) -> None:
    """The script's command line is one the CLI accepts: every option exists and every value parses (the
    command is parsed by the real CLI, not run)."""
    import shlex

    import typer

    from wavefront.cli import build_app

    verb, *args = shlex.split(command_line)
    group = typer.main.get_command(build_app())
    ctx = group.make_context("wavefront", [verb, "--help"], resilient_parsing=True)
    command = group.get_command(ctx, verb)
    assert command is not None, verb
    command.make_context(verb, args)  # raises click.UsageError / BadParameter on any unknown or bad option


_STEPS = """
source scripts/gpu_check_steps.sh
steps_init "$OUT/steps.jsonl" "$OUT/log" 0
run_step fast 20 echo hi
run_step cut 1 bash -c "echo partial > $OUT/partial.txt; sleep 60"
run_step bad 20 false
SKIP_RC=2 run_step optional 20 bash -c "exit 2"
skip_step elsewhere 30 "the device is sm_80, not sm_90/sm_100"
echo started > "$OUT/marker"
run_step long 60 sleep 60
echo never
"""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_steps_keep_partial_results_and_the_summary_prints_after_failures_and_a_kill(tmp_path):
    """The script's step runner with planted steps: one that runs past its limit after writing a file, one
    that fails, one skipped by its exit status and one this machine cannot run (skip_step), then the script
    itself ended (SIGTERM) during a long step. Every outcome is on
    disk, the file the cut step wrote survives, and the summary table prints within seconds of the kill."""
    proc = subprocess.Popen(["bash", "-c", _STEPS], cwd=ROOT, env=dict(os.environ, OUT=str(tmp_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "marker").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    time.sleep(0.5)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10  # the long step did not hold the summary back
    assert proc.returncode == 143 and "never" not in out
    assert (tmp_path / "partial.txt").read_text() == "partial\n"
    records = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["status"], r["rc"]) for r in records] == [
        ("fast", "ok", 0), ("cut", "timeout", 124), ("bad", "failed", 1), ("optional", "skipped", 0),
        ("elsewhere", "skipped", 0), ("long", "killed", 143)]
    assert "elsewhere: skipped, the device is sm_80, not sm_90/sm_100" in out  # the reason under the table
    table = out[out.index("== summary"):]
    for step, status in (("fast", "ok"), ("cut", "timeout"), ("bad", "failed"), ("long", "killed")):
        assert any(line.split()[:2] == [step, status] for line in table.splitlines()), (step, table)
    assert "== summary" in (tmp_path / "log").read_text()
