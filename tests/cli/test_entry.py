"""The command line's entry point pays for torch only on verbs that may run a kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import sys
sys.argv = ["wavefront", *{argv!r}]
import wavefront.cli as cli
try:
    cli.main()
except SystemExit:
    pass
print("TORCH_LOADED=" + str("torch" in sys.modules))
"""


@pytest.mark.parametrize(("argv", "loads_torch"), [
    (["--help"], False),
    (["trace", "--help"], False),
    (["plan", "--help"], False),
    (["bench", "--help"], True),
])
def test_torch_is_imported_only_for_kernel_verbs(argv, loads_torch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # let the CLI decide
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert f"TORCH_LOADED={loads_torch}" in proc.stdout, proc.stdout[-500:] + proc.stderr[-2000:]
