"""Test setup: on a machine without a GPU, kernels run under the Triton interpreter.

TRITON_INTERPRET must be set before the first @triton.jit kernel module is imported, so it is set here,
at collection time. The same tests run compiled on a GPU machine.

Every interpreted test runs under memcheck (wavefront.memcheck: each load, store, atomic and descriptor block
bounds-checked against the kernel's tensor arguments). ``--no-memcheck`` (or ``WAVEFRONT_MEMCHECK=0``) turns it
off; a test that must run without it is marked ``@pytest.mark.no_memcheck``.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The CLI's tables and help lay out to the terminal's width (rich reads COLUMNS when a console is made): one
# width for the whole run, so no test depends on the terminal it runs in; a test of another width sets COLUMNS
# in its own invocation.
os.environ["COLUMNS"] = "120"

import pytest  # noqa: E402


def pytest_addoption(parser):
    group = parser.getgroup("wavefront")
    group.addoption("--no-memcheck", action="store_true", default=False,
                    help="run interpreted kernels without memcheck (on by default under the interpreter)")
    group.addoption("--memcheck", choices=("on", "init"), default=None,
                    help="memcheck mode: on (bounds, the default) or init (also reads of unwritten memory)")


def pytest_configure(config):
    config.addinivalue_line("markers", "no_memcheck: run this test without memcheck")
    from wavefront import runtime
    from wavefront.kernels._memcheck import ENV, env_mode

    mode = config.getoption("--memcheck")
    if mode is None:
        mode = env_mode() if os.environ.get(ENV, "").strip() else "on"
    if config.getoption("--no-memcheck") or not runtime.interpreting():
        mode = None
        os.environ[ENV] = "0"  # and no launch turns it on from the environment
    config.wavefront_memcheck = mode


@pytest.fixture(autouse=True)
def _memcheck(request):
    mode = request.config.wavefront_memcheck
    if mode is None or request.node.get_closest_marker("no_memcheck"):
        yield
        return
    from wavefront.kernels._memcheck import checking

    with checking(initcheck=mode == "init"):
        yield


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def pytest_report_header(config):
    from wavefront import runtime

    info = runtime.describe()
    return (f"wavefront backend: {info['backend']} ({info['arch']}, warp {info['warp_size']}); "
            f"memcheck: {config.wavefront_memcheck or 'off'}")


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
