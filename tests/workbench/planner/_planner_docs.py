"""docs/planner.md's generated blocks, as the planner tests read and rebuild them: the block between
`<!-- marker ... -->` and `<!-- /marker -->`, and the accuracy-table lines split_summaries gives."""

from __future__ import annotations

import re
from pathlib import Path

from wavefront.workbench.planner.validation import TableReport, split_summaries

DOCS = Path(__file__).resolve().parents[3] / "docs" / "planner.md"


def documented(marker: str, prefixes: tuple[str, ...] = ("| held-out", "| calibration")) -> list[str]:
    """The lines of docs/planner.md's `marker` block that start with one of `prefixes` (the table rows)."""
    block = re.search(rf"<!-- {marker}.*?-->\n(.*?)<!-- /{marker} -->", DOCS.read_text(), re.S)
    assert block is not None, f"docs/planner.md has no {marker} block"
    return [line for line in block.group(1).splitlines() if line.startswith(prefixes)]


def summary_lines(reps: list[tuple[str, TableReport]]) -> list[str]:
    """An accuracy table's rows: every held-out, then every calibration summary of `reps` (report_tables)."""
    return [f"| {s.split} | {s.source} | {s.n_runs} | {s.median_abs_error:.1%} | {s.p90_abs_error:.1%} | "
            f"{s.signed_median_error:+.1%} |"
            for split in ("held-out", "calibration") for s in split_summaries(reps, split)]
