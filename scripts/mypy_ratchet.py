#!/usr/bin/env python
"""mypy over the whole package against a per-file error-count baseline that may only shrink.

    python scripts/mypy_ratchet.py            # run mypy on src/wavefront, compare with the baseline (CI)
    python scripts/mypy_ratchet.py --update   # after fixing errors: write the lower counts to the baseline
    python scripts/mypy_ratchet.py --from-output mypy.txt   # compare a saved mypy output instead of running it
    python scripts/mypy_ratchet.py --reset    # rewrite it from this run, rises included (say why in the commit)

The settings are pyproject.toml's [tool.mypy]: default strictness everywhere, strict on the torch-free
packages (its [[tool.mypy.overrides]]). Exit 1 when a file has more errors than its baseline count or a
file without a baseline count has any; the baseline (benchmarks/baselines/mypy.json) is never raised by
--update, so fix the new errors (or, where mypy is wrong, a `# type: ignore[code]` naming the code).
--reset is for the one case a rise is not a regression of the code checked: merging branches that were
never checked against this baseline.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "benchmarks" / "baselines" / "mypy.json"
SCHEMA = "wavefront.mypy-baseline/1"
_ERROR = re.compile(r"^(?P<path>[^:\s][^:]*\.pyi?):\d+(?::\d+)?: error: ")


def count_errors(output: str) -> Counter[str]:
    """Errors per file in mypy's output (notes are not errors)."""
    counts: Counter[str] = Counter()
    for line in output.splitlines():
        if m := _ERROR.match(line):
            counts[Path(m["path"]).as_posix()] += 1
    return counts


def compare(counts: Counter[str], baseline: dict[str, int]) -> tuple[list[str], list[str]]:
    """(regressions, improvements) as printable lines, file by file."""
    worse, better = [], []
    for path in sorted(set(counts) | set(baseline)):
        now, was = counts.get(path, 0), baseline.get(path, 0)
        if now > was:
            worse.append(f"{path}: {now} errors, baseline {was}" + ("" if path in baseline else " (new file)"))
        elif now < was:
            better.append(f"{path}: {now} errors, baseline {was}")
    return worse, better


def read_baseline(path: Path | None = None) -> dict[str, int]:
    path = path or BASELINE
    doc = json.loads(path.read_text())
    if doc.get("schema") != SCHEMA:
        raise SystemExit(f"{path}: expected schema {SCHEMA!r}, got {doc.get('schema')!r}")
    return {str(k): int(v) for k, v in doc["files"].items()}


def write_baseline(counts: Counter[str], path: Path | None = None) -> None:
    path = path or BASELINE
    files = {k: counts[k] for k in sorted(counts) if counts[k]}
    doc = {"schema": SCHEMA, "total": sum(files.values()),
           "note": "mypy errors per file (scripts/mypy_ratchet.py): counts may only go down", "files": files}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def run_mypy() -> str:
    proc = subprocess.run([sys.executable, "-m", "mypy", "src/wavefront"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or "error: " in proc.stderr:  # 2: mypy itself failed (a config error)
        raise SystemExit(f"mypy failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout[-2000:]}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="write the lower counts to the baseline")
    parser.add_argument("--reset", action="store_true", help="write this run's counts, rises included")
    parser.add_argument("--from-output", type=Path, metavar="FILE", help="a saved mypy output instead of a run")
    args = parser.parse_args(argv)
    counts = count_errors(args.from_output.read_text() if args.from_output else run_mypy())
    if not BASELINE.exists() and not (args.update or args.reset):
        raise SystemExit(f"no {BASELINE.relative_to(ROOT)}: write the first one with --update")
    baseline = read_baseline() if BASELINE.exists() else {}
    worse, better = compare(counts, baseline) if BASELINE.exists() else ([], [])
    total, was = sum(counts.values()), sum(baseline.values())
    if worse:
        print("mypy: more errors than the baseline allows (fix them: --update never raises a count):")
        print("\n".join("  " + w for w in worse))
    if args.update or args.reset:
        if worse and not args.reset:
            print(f"not updating {BASELINE.relative_to(ROOT)}: fix the files above first")
            return 1
        write_baseline(counts)
        print(f"mypy baseline: {total} errors in {len(+counts)} files (was {was}), "
              f"written to {BASELINE.relative_to(ROOT)}")
        return 0
    if better:
        print(f"mypy: {len(better)} file(s) now below the baseline; lower it with "
              "`python scripts/mypy_ratchet.py --update` and commit benchmarks/baselines/mypy.json:")
        print("\n".join("  " + b for b in better))
    print(f"mypy: {total} errors in {len(+counts)} files; baseline {was}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
