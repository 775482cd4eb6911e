"""Training KPIs in SQLite, so the dashboard and later runs can read them.

The harness writes two tables of its own (schema version :data:`SCHEMA_VERSION`) into the results store
(``wavefront-results.sqlite`` by default, wavefront.workbench.bench.store), beside the benchmark runs, so
``wavefront report`` shows training KPIs next to the kernel benchmarks. A missing store is created as a
results store first (:func:`ensure_store`), so it stays readable by every tool.

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

SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS train_runs (
    run_id TEXT NOT NULL, variant TEXT NOT NULL, started_at TEXT, status TEXT, git_sha TEXT, host TEXT,
    backend TEXT, device_name TEXT, world_size INTEGER, parallel TEXT, model TEXT, seq_len INTEGER,
    global_batch INTEGER, tokens_per_s REAL, tokens_per_s_per_device REAL, mfu REAL, hfu REAL,
    peak_tflops REAL, peak_source TEXT, peak_mem_bytes INTEGER, step_s REAL, cost_per_step REAL,
    cost_per_mtok REAL, energy_per_step_j REAL, energy_kind TEXT, final_loss REAL, config_json TEXT,
    summary_json TEXT, schema_version INTEGER, PRIMARY KEY (run_id, variant));
CREATE TABLE IF NOT EXISTS train_steps (
    run_id TEXT NOT NULL, variant TEXT NOT NULL, step INTEGER NOT NULL, loss REAL, step_s REAL, fwd_s REAL,
    bwd_s REAL, comm_s REAL, opt_s REAL, tokens_per_s REAL, mfu REAL, measured INTEGER,
    PRIMARY KEY (run_id, variant, step));
"""


DEFAULT_STORE = "wavefront-results.sqlite"


def check_store(path: str | Path) -> None:
    """An existing file at `path` must be a results store (ValueError otherwise); nothing is created."""
    from wavefront.workbench.bench.store import ResultStore, StoreError

    if Path(path).exists():
        try:
            ResultStore(path, create=False).close()
        except StoreError as exc:
            raise ValueError(f"--store: {exc}") from None


def ensure_store(path: str | Path) -> None:
    """Create the results store at `path` if absent (its schema first, then the training tables)."""
    from wavefront.workbench.bench.store import ResultStore

    ResultStore(path).close()


def has_training(path: str | Path) -> bool:
    """Whether the store at `path` holds training runs."""
    if not Path(path).exists():
        return False
    con = sqlite3.connect(str(path))
    try:
        query = "SELECT 1 FROM sqlite_master WHERE type='table' AND name='train_runs'"
        return con.execute(query).fetchone() is not None
    finally:
        con.close()


def write_variant(path: str | Path, *, run_id: str, variant: str, status: str, provenance: dict, config: dict,
                  summary: dict | None, steps: list[dict]) -> None:
    ensure_store(path)
    con = sqlite3.connect(str(path), timeout=30)
    try:
        con.executescript(_DDL)
        s = summary or {}
        peak = s.get("peak") or {}
        con.execute(
            "INSERT OR REPLACE INTO train_runs VALUES (" + ",".join("?" * 29) + ")",
            (run_id, variant, provenance.get("started_at"), status, provenance.get("git_sha"),
             provenance.get("host"), provenance.get("backend"), provenance.get("device_name"),
             provenance.get("world_size"), provenance.get("parallel"), config.get("model"), config.get("seq_len"),
             config.get("global_batch"), s.get("tokens_per_s"), s.get("tokens_per_s_per_device"), s.get("mfu"),
             s.get("hfu"), peak.get("tflops"), peak.get("source"), s.get("peak_mem_bytes"), s.get("step_s_mean"),
             s.get("cost_per_step"), s.get("cost_per_mtok"), s.get("energy_per_step_j"), s.get("energy_kind"),
             s.get("final_loss"), json.dumps(config), json.dumps(summary), SCHEMA_VERSION))
        con.executemany(
            "INSERT OR REPLACE INTO train_steps VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(run_id, variant, r["step"], r["loss"], r["step_s"], r["fwd_s"], r["bwd_s"], r["comm_s"], r["opt_s"],
              r["tokens_per_s"], r["mfu"], int(r["measured"])) for r in steps])
        con.commit()
    finally:
        con.close()


def read_runs(path: str | Path) -> list[dict]:
    con = sqlite3.connect(str(path))
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM train_runs ORDER BY started_at, variant")]
    finally:
        con.close()


def read_steps(path: str | Path, run_id: str, variant: str) -> list[dict]:
    con = sqlite3.connect(str(path))
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM train_steps WHERE run_id=? AND variant=? ORDER BY step",
                                             (run_id, variant))]
    finally:
        con.close()
