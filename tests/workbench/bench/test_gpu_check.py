"""scripts/gpu_check.sh --dry-run: the plan a lent GPU would run, and its provenance file, without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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
    assert f"--budget-s 80 --store {stem}.sqlite --no-report --json {stem}.peers.json" in peers
    # Every other registered op in the general bench, each exactly once; attention and linear not again.
    from wavefront.ops import REGISTRY

    bench = next(line for line in log.splitlines() if f"--json {stem}.json" in line)
    ops = bench.split("--op ")[1:]
    assert sorted(o.split()[0] for o in ops) == sorted(n for n in REGISTRY if n not in ("attention", "linear"))
    assert "--provider liger" in bench and f"--store {stem}.sqlite" in bench
    train = next(line for line in log.splitlines() if "-m wavefront train" in line)
    assert "--compare eager,compile,liger,wavefront --model llama3-8b" in train and f"{stem}.train.json" in train
    _assert_verb_parses(train.split("-m wavefront ", 1)[1])
    assert f"--export-json {stem}.results.json" in log
    # Every step that runs has a time limit, and the limits add up to less than 8 minutes.
    limits = [int(line.split("timeout ")[1].split()[0]) for line in log.splitlines() if line.startswith("+ timeout")]
    assert len(limits) == 5 and sum(limits) < 8 * 60 - 30
    gluon = next(line for line in log.splitlines() if line.startswith("+ timeout") and "gluon.json" in line)
    assert f"{stem}.gluon.json" in gluon  # the opt-in Gluon attention forward, checked and timed on sm_90
    meta = json.loads(metas[0].read_text())
    assert meta["dry_run"] is True and meta["torch"] and meta["runtime"]["backend"]
    assert "flash_attn" in meta and "liger_kernel" in meta
    assert meta["date_utc"].endswith("Z") and "git_sha" in meta
    assert not list(tmp_path.glob("*.sqlite"))  # nothing ran


def test_unknown_argument_is_one_clear_line(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--bogus"], cwd=ROOT,
                          env=dict(os.environ, OUT=str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--bogus" in proc.stderr


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
