"""The command line's entry point pays only for the verb it runs: `wavefront --help` imports no verb module,
no workbench module and no torch; a verb imports its own module alone, and torch only where it may run a
kernel. The root group's table of verbs (cli.VERBS) names exactly what the verb modules register."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import wavefront.cli as cli

DATA = Path(__file__).resolve().parents[1] / "data"
NCU_CSV = str(DATA / "counters" / "ncu_raw_h100_a.csv")
TRACE = str(DATA / "traces" / "cpu_train_h64.json.gz")

PROBE = """
import json, sys
sys.argv = ["wavefront", *{argv!r}]
import wavefront.cli as cli
code = 0
try:
    cli.main()
except SystemExit as exc:
    code = exc.code
print("EXIT=" + str(code))
print("LOADED=" + json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("wavefront."))))
"""

VERB_MODULES = {verb.module for verb in cli.VERBS.values()}


def _loaded(argv: list[str]) -> set[str]:
    """The torch and wavefront modules imported by `wavefront ARGV`, run (successfully) in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # let the CLI decide
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                          timeout=120, env=env)
    found = re.search(r"^LOADED=(.*)$", proc.stdout, re.M)
    assert found and "EXIT=0" in proc.stdout, proc.stdout[-500:] + proc.stderr[-2000:]
    return set(json.loads(found.group(1)))


def test_root_help_imports_no_verb_module_no_workbench_and_no_torch():
    loaded = _loaded(["--help"])
    assert "wavefront.cli" in loaded  # the probe ran the CLI
    assert "torch" not in loaded
    assert not {m for m in loaded if m.startswith("wavefront.workbench")}, sorted(loaded)
    assert not loaded & VERB_MODULES, sorted(loaded & VERB_MODULES)


@pytest.mark.parametrize(("argv", "module", "loads_torch"), [
    (["trace", "--help"], "wavefront.cli.trace", False),
    (["plan", "--help"], "wavefront.cli.plan", False),
    (["plan", "--model", "llama3-8b", "--gpus", "8xh100", "--top", "1", "--json", os.devnull], "wavefront.cli.plan",
     False),  # a whole run, not only its help
    (["counters", NCU_CSV, "--json", os.devnull], "wavefront.cli.counters", False),
    (["trace", "analyze", TRACE, "--workers", "1", "--json", os.devnull], "wavefront.cli.trace", False),
    (["bench", "--help"], "wavefront.cli.bench", True),
])
def test_a_verb_imports_its_own_module_and_torch_only_for_kernel_verbs(argv, module, loads_torch):
    loaded = _loaded(argv)
    assert ("torch" in loaded) == loads_torch, sorted(loaded)
    assert loaded & VERB_MODULES == {module}


def test_torch_free_verbs_are_the_table_rows_marked_so():
    assert set(cli.TORCH_FREE_VERBS) == {"plan", "trace", "counters"}
    assert not cli._needs_backend(["wavefront", "--help"]) and not cli._needs_backend(["wavefront", "plan", "--help"])
    assert cli._needs_backend(["wavefront", "bench", "--help"])


def test_the_verb_table_names_exactly_what_each_module_registers():
    """Each module, loaded into an app of its own, registers exactly the verbs its rows name."""
    for module in VERB_MODULES:
        app = typer.Typer()
        __import__(module, fromlist=["register"]).register(app)
        registered = set(typer.main.get_group(app).commands)
        assert registered == {name for name, verb in cli.VERBS.items() if verb.module == module}, module


def test_root_help_lists_every_verb_with_its_summary_on_one_line():
    r = CliRunner().invoke(cli.build_app(), ["--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for name, verb in cli.VERBS.items():
        assert any(re.search(rf"\s{name}\s+{re.escape(verb.summary)}\s", line) for line in lines), name


def test_an_unknown_verb_is_one_line_with_a_suggestion():
    r = CliRunner().invoke(cli.build_app(), ["benhc"])
    assert r.exit_code == 2
    (line,) = r.stderr.strip().splitlines()
    assert "No such command 'benhc'" in line and "'bench'" in line
