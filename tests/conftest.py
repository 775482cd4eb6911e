"""Test setup: on a machine without a GPU, kernels run under the Triton interpreter.

TRITON_INTERPRET must be set before the first @triton.jit kernel module is imported, so it is set here,
at collection time. The same tests run compiled on a GPU machine.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def pytest_report_header(config):
    from wavefront import runtime

    info = runtime.describe()
    return f"wavefront backend: {info['backend']} ({info['arch']}, warp {info['warp_size']})"


# ---------------------------------------------------------------------------------------------------
# The dashboard's browser tests (marked `browser`) skip without headless Chromium: say so in one line at the
# end of the run, and in CI (CI=true) count the skip as a failure, so CI never passes without running them.

_BROWSER_SKIPS: list[tuple[str, str]] = []


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def pytest_runtest_logreport(report):
    if report.skipped and "browser" in report.keywords:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _BROWSER_SKIPS.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_terminal_summary(terminalreporter):
    if not _BROWSER_SKIPS:
        return
    line = (f"skipped {len(_BROWSER_SKIPS)} dashboard browser tests ({_BROWSER_SKIPS[0][1]}): run "
            "scripts/install.sh --dev as root on Debian, or install chromium and chromium-driver"
            + ("; in CI this is a failure" if _in_ci() else ""))
    terminalreporter.write_line(line, red=_in_ci(), yellow=not _in_ci())


def pytest_sessionfinish(session, exitstatus):
    if _BROWSER_SKIPS and _in_ci() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
