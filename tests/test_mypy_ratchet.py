"""The mypy baseline only goes down: the checker CI runs (scripts/mypy_ratchet.py), on saved outputs."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mypy_ratchet", ROOT / "scripts" / "mypy_ratchet.py")
assert _spec is not None and _spec.loader is not None
ratchet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ratchet)

OUTPUT = """\
src/wavefront/a.py:3: error: Missing type arguments for generic type "dict"  [type-arg]
src/wavefront/a.py:9:5: error: Function is missing a type annotation  [no-untyped-def]
src/wavefront/a.py:9: note: Use "-> None" if function does not return a value
src/wavefront/b.py:1: error: Name "x" is not defined  [name-defined]
Found 3 errors in 2 files (checked 2 source files)
"""


def test_errors_are_counted_per_file_and_notes_are_not():
    assert ratchet.count_errors(OUTPUT) == Counter({"src/wavefront/a.py": 2, "src/wavefront/b.py": 1})
    assert ratchet.count_errors("Success: no issues found in 2 source files\n") == Counter()


def test_a_file_over_its_count_or_a_new_file_with_errors_is_a_regression():
    counts = Counter({"src/wavefront/a.py": 2, "src/wavefront/b.py": 1})
    worse, better = ratchet.compare(counts, {"src/wavefront/a.py": 1, "src/wavefront/c.py": 4})
    assert worse == ["src/wavefront/a.py: 2 errors, baseline 1",
                     "src/wavefront/b.py: 1 errors, baseline 0 (new file)"]
    assert better == ["src/wavefront/c.py: 0 errors, baseline 4"]
    assert ratchet.compare(counts, {"src/wavefront/a.py": 2, "src/wavefront/b.py": 1}) == ([], [])


def test_the_checker_fails_on_growth_and_never_raises_the_baseline(tmp_path, monkeypatch, capsys):
    baseline = tmp_path / "mypy.json"
    monkeypatch.setattr(ratchet, "BASELINE", baseline)
    monkeypatch.setattr(ratchet, "ROOT", tmp_path)
    out = tmp_path / "mypy.txt"
    out.write_text(OUTPUT)
    assert ratchet.main(["--from-output", str(out), "--update"]) == 0
    assert json.loads(baseline.read_text())["files"] == {"src/wavefront/a.py": 2, "src/wavefront/b.py": 1}
    assert ratchet.main(["--from-output", str(out)]) == 0
    out.write_text(OUTPUT + 'src/wavefront/b.py:7: error: Incompatible types  [assignment]\n')
    assert ratchet.main(["--from-output", str(out)]) == 1
    assert "src/wavefront/b.py: 2 errors, baseline 1" in capsys.readouterr().out
    assert ratchet.main(["--from-output", str(out), "--update"]) == 1  # refuses to raise it
    assert json.loads(baseline.read_text())["files"]["src/wavefront/b.py"] == 1
    assert ratchet.main(["--from-output", str(out), "--reset"]) == 0  # the merge case, said out loud
    assert json.loads(baseline.read_text())["files"]["src/wavefront/b.py"] == 2
    out.write_text(OUTPUT)
    out.write_text(OUTPUT.replace("src/wavefront/b.py:1: error", "src/wavefront/b.py:1: note"))
    assert ratchet.main(["--from-output", str(out)]) == 0
    assert "--update" in capsys.readouterr().out  # says how to lower it


def test_the_committed_baseline_names_existing_files_only():
    baseline = ratchet.read_baseline()
    assert baseline, "benchmarks/baselines/mypy.json lists no file"
    missing = [f for f in baseline if not (ROOT / f).is_file()]
    assert not missing, f"the mypy baseline names files that are gone (run the checker with --update): {missing}"


@pytest.mark.parametrize("package", ["workbench/trace", "workbench/planner", "workbench/counters"])
def test_the_strict_packages_are_in_the_strict_override(package):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs") and o.get("disallow_any_generics")]
    assert any("wavefront." + package.replace("/", ".") + ".*" in o["module"] for o in strict)
