"""Training KPIs in SQLite, so the dashboard and later runs can read them.

The harness writes its two tables into the results file (``wavefront-results.sqlite`` by default), beside
the benchmark runs, so ``wavefront report`` shows training KPIs next to the kernel benchmarks. Both live
in one schema with one ``PRAGMA user_version`` (wavefront.workbench.sqlite_schema): opening the file
creates or migrates all of it atomically, whichever tool comes first, and concurrent writers wait on
SQLite's lock instead of failing. The tables (schema version 1 onwards):

``train_runs``  one row per (run, variant): provenance, config, and the summary KPIs as columns
                (tokens/s, MFU, HFU, peak memory, step time, $/step, $/Mtok, energy/step) plus the full
                summary as JSON.
``train_steps`` one row per step: loss, step time and its split, tokens/s, MFU.

Rows of a failed run are written too (``status`` says how it ended): nothing measured is lost.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from wavefront.workbench import sqlite_schema

SCHEMA_VERSION = sqlite_schema.SCHEMA_VERSION
DEFAULT_STORE = "wavefront-results.sqlite"


def _open(path: str | Path, *, create: bool) -> sqlite3.Connection:
    try:
        con = sqlite_schema.connect(path, create=create)
    except sqlite_schema.SchemaError as exc:
        raise ValueError(str(exc)) from None
    con.row_factory = sqlite3.Row
    return con


def check_store(path: str | Path) -> None:
    """An existing file at `path` must be a results store (ValueError naming --store otherwise); a missing
    one is fine (it is created on the first write). An older store is migrated here."""
    p = Path(path)
    if p.exists() or p.is_dir():
        try:
            _open(p, create=False).close()
        except ValueError as exc:
            raise ValueError(f"--store: {exc}") from None


def ensure_store(path: str | Path) -> None:
    """Create the results file at `path` if absent, or migrate it to the current schema."""
    _open(path, create=True).close()


def has_training(path: str | Path) -> bool:
    """Whether the store at `path` holds training runs."""
    if not Path(path).is_file():
        return False
    con = _open(path, create=False)
    try:
        return con.execute("SELECT 1 FROM train_runs LIMIT 1").fetchone() is not None
    finally:
        con.close()


def write_variant(
    path: str | Path,
    *,
    run_id: str,
    variant: str,
    status: str,
    provenance: dict,
    config: dict,
    summary: dict | None,
    steps: list[dict],
) -> None:
    con = _open(path, create=True)
    try:
        s = summary or {}
        peak = s.get("peak") or {}
        with con:  # one transaction: the run's row and its steps appear together
            con.execute(
                "INSERT OR REPLACE INTO train_runs VALUES (" + ",".join("?" * 29) + ")",
                (
                    run_id,
                    variant,
                    provenance.get("started_at"),
                    status,
                    provenance.get("git_sha"),
                    provenance.get("host"),
                    provenance.get("backend"),
                    provenance.get("device_name"),
                    provenance.get("world_size"),
                    provenance.get("parallel"),
                    config.get("model"),
                    config.get("seq_len"),
                    config.get("global_batch"),
                    s.get("tokens_per_s"),
                    s.get("tokens_per_s_per_device"),
                    s.get("mfu"),
                    s.get("hfu"),
                    peak.get("tflops"),
                    peak.get("source"),
                    s.get("peak_mem_bytes"),
                    s.get("step_s_mean"),
                    s.get("cost_per_step"),
                    s.get("cost_per_mtok"),
                    s.get("energy_per_step_j"),
                    s.get("energy_kind"),
                    s.get("final_loss"),
                    json.dumps(config),
                    json.dumps(summary),
                    SCHEMA_VERSION,
                ),
            )
            con.executemany(
                "INSERT OR REPLACE INTO train_steps VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        run_id,
                        variant,
                        r["step"],
                        r["loss"],
                        r["step_s"],
                        r["fwd_s"],
                        r["bwd_s"],
                        r["comm_s"],
                        r["opt_s"],
                        r["tokens_per_s"],
                        r["mfu"],
                        int(r["measured"]),
                    )
                    for r in steps
                ],
            )
    finally:
        con.close()


def read_runs(path: str | Path) -> list[dict]:
    con = _open(path, create=False)
    try:
        return [dict(r) for r in con.execute("SELECT * FROM train_runs ORDER BY started_at, variant")]
    finally:
        con.close()


def read_steps(path: str | Path, run_id: str, variant: str) -> list[dict]:
    con = _open(path, create=False)
    try:
        return [
            dict(r)
            for r in con.execute(
                "SELECT * FROM train_steps WHERE run_id=? AND variant=? ORDER BY step", (run_id, variant)
            )
        ]
    finally:
        con.close()
