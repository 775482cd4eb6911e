"""`wavefront bench --profile`: the command lines each profiler gets, the missing-tool and no-GPU messages,
and the profile read back (a stand-in runner writes what the tool would)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.cli._common import Profiler
from wavefront.workbench.jobs import profile
from wavefront.workbench.jobs.request import RequestError
from wavefront.workbench.trace.testing import planted_gpu_trace, write_nsys_sqlite, write_rocprof_csv

runner = CliRunner()
SELECTION = ("--op", "softmax", "--case", "npow2")


def test_cli_choices_mirror_the_library():
    assert tuple(p.value for p in Profiler) == profile.PROFILERS


def test_selection_repeats_each_option():
    assert profile.selection(["softmax", "rms_norm"], ["fwd"], (), ["bf16"], ["npow2"]) == (
        "--op", "softmax", "--op", "rms_norm", "--mode", "fwd", "--dtype", "bf16", "--case", "npow2")


@pytest.mark.parametrize("tool", profile.PROFILERS)
def test_command_lines(tmp_path, tool):
    child = profile.child_bench(SELECTION, tool)
    assert child[:4] == [sys.executable, "-m", "wavefront", "bench"] and child[-4:] == list(SELECTION)
    assert "--no-store" in child and "--skip-correctness" in child and "--no-report" in child
    assert ("--reps" in child) == (tool == "ncu")  # ncu replays every launch per counter pass
    cmds = profile.profile_commands(tool, f"/opt/{tool}", tmp_path, child)
    first = cmds[0]
    assert first[0] == f"/opt/{tool}" and first[-len(child):] == child
    if tool == "nsys":
        assert first[1:3] == ["profile", "--trace=cuda,nvtx"] and f"--output={tmp_path / 'bench_nsys'}" in first
        assert cmds[1][1:3] == ["export", "--type=sqlite"] and cmds[1][-1] == f"{tmp_path / 'bench_nsys'}.nsys-rep"
        assert f"--output={tmp_path / 'bench_nsys.sqlite'}" in cmds[1]
    elif tool == "ncu":
        assert first[1:3] == ["--set", "full"] and "--target-processes" in first
        assert cmds[1][1:] == ["--import", f"{tmp_path / 'bench_ncu'}.ncu-rep", "--csv", "--page", "raw"]
    else:
        assert first[1:4] == ["--runtime-trace", "--output-format", "csv"] and first[-len(child) - 1] == "--"
        assert str(tmp_path / "rocprof") in first and len(cmds) == 1


def _bench(*args, env=None):
    return runner.invoke(build_app(), ["bench", *args], env=env)


def test_missing_tool_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    res = _bench("--profile", "nsys", "--op", "softmax", "--profile-dir", tmp_path / "p")
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text
    assert text.startswith("error: --profile: nsys: nsys is not on PATH")
    assert not (tmp_path / "p").exists()
    with pytest.raises(RequestError, match="rocprofv3 is not on PATH"):
        profile.check_can_profile("rocprof")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the no-GPU message needs a machine without one")
def test_tool_without_gpu_is_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    res = _bench("--profile", "ncu", "--op", "softmax", "--profile-dir", tmp_path / "p")
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in text
    assert "--profile: ncu profiles an NVIDIA GPU, and torch sees none on this machine" in text


def _fake_tool(tool):
    """A runner that writes what the tool would, from the planted timeline, and records the calls."""
    calls = []

    def run(cmd, capture_output=False, text=True, check=False):
        calls.append(cmd)
        if tool == "nsys" and cmd[1] == "export":
            write_nsys_sqlite(planted_gpu_trace(), next(a for a in cmd if a.startswith("--output="))[9:])
        elif tool == "rocprof":
            write_rocprof_csv(planted_gpu_trace("amd"), f"{cmd[cmd.index('--output-directory') + 1]}/host",
                              prefix="77_")
        elif tool == "ncu" and "--import" in cmd:
            return subprocess.CompletedProcess(cmd, 0, '"ID","Kernel Name"\n"0","softmax_fwd"\n', "")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run, calls


@pytest.mark.parametrize("tool", ["nsys", "rocprof"])
def test_timeline_is_read_back(tmp_path, tool):
    run, calls = _fake_tool(tool)
    result = profile.run_profile(profile.ProfileRequest(tool, str(tmp_path), SELECTION), runner=run,
                                 exe=f"/opt/{tool}")
    assert calls == profile.profile_commands(tool, f"/opt/{tool}", tmp_path, profile.child_bench(SELECTION, tool))
    doc = json.loads((tmp_path / f"bench_{tool}.trace.json").read_text())
    steps = doc["ranks"][0]["steps"]
    assert [s["step"] for s in steps] == [1, 2] and steps[0]["compute_ns"] == 400_000
    assert result.analysis in result.files and result.as_dict()["schema"] == profile.SCHEMA


def test_ncu_writes_the_report_and_raw_page(tmp_path):
    run, _ = _fake_tool("ncu")
    result = profile.run_profile(profile.ProfileRequest("ncu", str(tmp_path), SELECTION), runner=run, exe="/opt/ncu")
    assert (tmp_path / "bench_ncu_raw.csv").read_text().startswith('"ID","Kernel Name"')
    assert result.analysis is None and result.next_steps[0].startswith(f"wavefront counters {tmp_path}")


def test_tool_failure_names_the_tool(tmp_path):
    def failing(cmd, **_):
        return subprocess.CompletedProcess(cmd, 3, "", "")

    with pytest.raises(RuntimeError, match="nsys exited with status 3"):
        profile.run_profile(profile.ProfileRequest("nsys", str(tmp_path)), runner=failing, exe="/opt/nsys")


def test_no_timeline_is_said(tmp_path):
    def silent(cmd, **_):
        return subprocess.CompletedProcess(cmd, 0, "", "")

    with pytest.raises(RuntimeError, match="rocprof left no timeline"):
        profile.run_profile(profile.ProfileRequest("rocprof", str(tmp_path)), runner=silent, exe="/opt/rocprofv3")
