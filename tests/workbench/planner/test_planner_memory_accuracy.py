"""Memory per GPU against published peak-memory figures (torchtitan's benchmark tables: the caching
allocator's peak reserved memory, GiB), split into calibration and held-out rows by the planner's hash rule
(validation.split_of on table name and row id) before any prediction. Nothing in the memory model is
fitted, on either part: the split says which rows were looked at while the model was changed (the
calibration rows and, in the Dec 2024 table, every row: its memory column was in the repository before).

Reproduce: `wavefront plan --validate tests/data/published/torchtitan_llama3_h100_202412.json --validate
tests/data/published/memory/torchtitan_llama3_8b_h200_202506.json` (per-row errors), and this file with
`-s` (the per-table, per-split medians of docs/planner.md, Memory)."""

from __future__ import annotations

import statistics
from pathlib import Path

from wavefront.workbench.planner.validation import load_table, split_of, validate

PUBLISHED = Path(__file__).parents[2] / "data" / "published"
MEMORY_TABLES = ("torchtitan_llama3_h100_202412.json", "memory/torchtitan_llama3_8b_h200_202506.json")


def _memory_rows() -> list:
    rows = []
    for name in MEMORY_TABLES:
        doc = load_table(PUBLISHED / name)
        for r in validate(doc).rows:
            if r.metric == "memory_gib":
                rows.append((r, r.split or split_of(doc["name"], r.row)))
    return rows


def _summary(rows: list) -> dict:
    """(table or "overall", split) -> (runs, median |error|, signed median)."""
    out = {}
    for table in sorted({r.table for r, _ in rows}) + ["overall"]:
        for split in ("calibration", "held-out"):
            errs = [r.rel_error for r, s in rows if s == split and table in ("overall", r.table)]
            if errs:
                out[(table, split)] = (len(errs), statistics.median(abs(e) for e in errs), statistics.median(errs))
    return out


def test_splits_are_the_hash_rule_written_before_prediction():
    doc = load_table(PUBLISHED / "memory" / "torchtitan_llama3_8b_h200_202506.json")
    assert all(row["split"] == split_of(doc["name"], row["id"]) for row in doc["rows"])


def test_memory_against_published_peaks_regression_guard():
    """Held-out median |error| 11.6% over torchtitan's Dec 2024 table (10 rows, target 15%; was 15.8% before
    the stack profile's per-op policy reached the memory model (torchtitan keeps every other matmul output:
    its two per-op rows went from +15%/+21% to -8%), 41% before the loss's fp32 logits, Table 5's
    micro-batches and the pipelined FSDP's unsharded gradients). The H200 table's two rows (both calibration
    by the hash) are +73%: torch.compile and the float8 all-gather are not modelled (docs/planner.md, Memory)."""
    rows = _memory_rows()
    summary = _summary(rows)
    for (table, split), (n, med, signed) in summary.items():
        print(f"\n{split:11s} {table:34s} {n:2d} rows  median |error| {med:6.1%}  signed {signed:+6.1%}")
    assert len(rows) == 15
    n, med, _ = summary[("torchtitan_llama3_h100_202412", "held-out")]
    assert n == 10 and med <= 0.12
    n, med, signed = summary[("torchtitan_llama3_8b_h200_202506", "calibration")]
    assert n == 2 and med <= 0.74 and signed > 0
    # every row is under the reserved peak (an upper bound of what is allocated), the per-op rows too
    assert all(-0.27 <= r.rel_error <= 0.0 for r, _ in rows if r.table.endswith("202412"))


def test_docs_memory_table_is_what_the_model_computes():
    """docs/planner.md's memory-accuracy table (Memory section) states these figures."""
    docs = (Path(__file__).parents[3] / "docs" / "planner.md").read_text()
    block = docs.split("<!-- memory-accuracy:", 1)[1].split("\n\n", 1)[0]
    stated = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] in ("held-out", "calibration"):
            stated[(cells[1].split()[0], cells[0])] = (int(cells[2]), cells[3], cells[4])
    computed = {key: (n, f"{med:.1%}", f"{signed:+.1%}") for key, (n, med, signed) in _summary(_memory_rows()).items()
                if key[0] != "overall"}
    assert stated == computed
