"""The command line's entry point pays for torch only on verbs that may run a kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NCU_CSV = str(Path(__file__).resolve().parents[1] / "data" / "counters" / "ncu_raw_h100_a.csv")

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
    (["counters", NCU_CSV, "--json", os.devnull], False),  # a whole run, not only its help
    (["bench", "--help"], True),
])
def test_torch_is_imported_only_for_kernel_verbs(argv, loads_torch):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # let the CLI decide
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert f"TORCH_LOADED={loads_torch}" in proc.stdout, proc.stdout[-500:] + proc.stderr[-2000:]
