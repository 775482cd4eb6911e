"""The results file's schema and its ``PRAGMA user_version`` migrations, shared by both stores.

One SQLite file (``wavefront-results.sqlite`` by default) holds the benchmark runs
(wavefront.workbench.bench.store) and the training KPIs (wavefront.workbench.distributed.train.store), so
``wavefront report`` shows both from one path. Both stores open it through :func:`connect`, which brings
the file to :data:`SCHEMA_VERSION` by running the ordered :data:`MIGRATIONS` whose number is above the
file's ``user_version``, all in one ``BEGIN IMMEDIATE`` transaction:

- creation is atomic: two processes creating the same file at once serialize on SQLite's write lock
  (waiting up to :data:`BUSY_TIMEOUT_S`); the second finds the schema complete and changes nothing;
- a file written by an older wavefront is migrated in place the first time a newer one opens it; a file
  written by a newer one is refused with both versions named;
- ``PRAGMA application_id`` marks the file as ours, so another program's SQLite file is refused.

Files from before ``user_version`` (schema 1, recognised by ``schema_info.schema_version = '1'``) enter
the chain at step 1, whose statements are idempotent. ``schema_info.schema_version`` is kept equal to
``user_version``: a wavefront that predates this module reads it and refuses a newer file cleanly.

The journal stays in SQLite's default rollback mode rather than WAL: writers here are few and commit per
row group, a busy timeout is enough for them, and WAL would leave two side files beside the store and
need a writable directory even to read it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

APPLICATION_ID = 0x57465253  # "WFRS"
BUSY_TIMEOUT_S = 30.0


class SchemaError(ValueError):
    """The file is not a wavefront results file this wavefront can read."""


@dataclass(frozen=True)
class Migration:
    """One step: brings a file at ``version - 1`` to ``version``. `apply` is a sequence of SQL statements
    or a function of the connection (inside the migration's transaction; it must not commit)."""

    version: int
    description: str
    apply: tuple[str, ...] | Callable[[sqlite3.Connection], None]


# Schema 1 exactly as wavefront wrote it before migrations (columns untyped, names from the records'
# dataclass fields at that time). Frozen: a later change is a new step, never an edit here.
_V1 = (
    "CREATE TABLE IF NOT EXISTS schema_info (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created_utc, label, git_sha, "
    "git_dirty, device_name, arch, backend, torch, triton, python, host, timing, driver, copy_gbps, flush_bytes, "
    "device_model, extra)",
    "CREATE TABLE IF NOT EXISTS measurements (run_id INTEGER NOT NULL REFERENCES runs(id), op, case_name, mode, "
    "dtype, provider, status, reason, dims, method, flush, n_warmup, calls_per_sample, samples_us, flops, "
    "min_bytes, gbps, tflops, pct_peak_bw, pct_peak_flops, pct_copy_bw, peak_mem_bytes, max_diff_vs_eager)",
    "CREATE INDEX IF NOT EXISTS measurements_run ON measurements(run_id)",
    "CREATE TABLE IF NOT EXISTS correctness (run_id INTEGER NOT NULL REFERENCES runs(id), op, case_name, dtype, "
    "passed, error, fwd_err_ours, fwd_err_eager, fwd_bound, bwd_err_ours, bwd_err_eager, bwd_bound, wall_s)",
    "CREATE INDEX IF NOT EXISTS correctness_run ON correctness(run_id)",
    "CREATE TABLE IF NOT EXISTS train_runs (run_id TEXT NOT NULL, variant TEXT NOT NULL, started_at TEXT, "
    "status TEXT, git_sha TEXT, host TEXT, backend TEXT, device_name TEXT, world_size INTEGER, parallel TEXT, "
    "model TEXT, seq_len INTEGER, global_batch INTEGER, tokens_per_s REAL, tokens_per_s_per_device REAL, "
    "mfu REAL, hfu REAL, peak_tflops REAL, peak_source TEXT, peak_mem_bytes INTEGER, step_s REAL, "
    "cost_per_step REAL, cost_per_mtok REAL, energy_per_step_j REAL, energy_kind TEXT, final_loss REAL, "
    "config_json TEXT, summary_json TEXT, schema_version INTEGER, PRIMARY KEY (run_id, variant))",
    "CREATE TABLE IF NOT EXISTS train_steps (run_id TEXT NOT NULL, variant TEXT NOT NULL, step INTEGER NOT NULL, "
    "loss REAL, step_s REAL, fwd_s REAL, bwd_s REAL, comm_s REAL, opt_s REAL, tokens_per_s REAL, mfu REAL, "
    "measured INTEGER, PRIMARY KEY (run_id, variant, step))",
    "INSERT OR IGNORE INTO schema_info VALUES ('schema_version', '1')",
)

# Schema 2: a run's status (an interrupted bench run is marked and left out of `latest`), and the JSON
# documents a run produced (inspect, traffic) so the dashboard can show them again later.
_V2 = (
    "ALTER TABLE runs ADD COLUMN status TEXT NOT NULL DEFAULT 'complete'",
    # Before schema 2 an interrupted run was an empty row; mark those so the gate stops reading them.
    "UPDATE runs SET status = 'incomplete' WHERE NOT EXISTS (SELECT 1 FROM measurements m WHERE m.run_id = runs.id) "
    "AND NOT EXISTS (SELECT 1 FROM correctness c WHERE c.run_id = runs.id)",
    "CREATE TABLE documents (run_id INTEGER NOT NULL REFERENCES runs(id), name TEXT NOT NULL, schema TEXT, "
    "body TEXT NOT NULL, PRIMARY KEY (run_id, name))",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "runs, measurements, correctness, train_runs, train_steps", _V1),
    Migration(2, "runs.status; documents", _V2),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _legacy_version(con: sqlite3.Connection, path: Path) -> int:
    """The schema of a file without user_version: 0 (empty) or 1 (written before migrations)."""
    tables = _tables(con) - {"sqlite_sequence"}
    if not tables:
        return 0
    if "schema_info" not in tables:
        raise SchemaError(
            f"{path} is an SQLite file but not a wavefront results store (tables: {', '.join(sorted(tables))})"
        )
    row = con.execute("SELECT value FROM schema_info WHERE key='schema_version'").fetchone()
    if row is None or row[0] != "1":
        raise SchemaError(
            f"{path} has results-store schema version {row[0] if row else None!r} but no "
            "user_version; it was not written by wavefront"
        )
    return 1


def _apply(con: sqlite3.Connection, step: Migration) -> None:
    if callable(step.apply):
        step.apply(con)
    else:
        for statement in step.apply:
            con.execute(statement)


def migrate(con: sqlite3.Connection, path: Path, migrations: tuple[Migration, ...] = MIGRATIONS) -> tuple[int, int]:
    """Bring the file open on `con` (autocommit mode) to the last migration's version in one write
    transaction; returns (version found, version now)."""
    latest = migrations[-1].version
    con.execute("BEGIN IMMEDIATE")  # the write lock first: a concurrent creator waits here, then sees our schema
    try:
        app_id = con.execute("PRAGMA application_id").fetchone()[0]
        if app_id not in (0, APPLICATION_ID):
            raise SchemaError(
                f"{path} is an SQLite file of another application (application_id {app_id:#x}), "
                "not a wavefront results store"
            )
        found = con.execute("PRAGMA user_version").fetchone()[0]
        if found == 0:
            found = _legacy_version(con, path)
        if found > latest:
            raise SchemaError(
                f"{path} has results-store schema version {found}; this wavefront reads versions up "
                f"to {latest} (open it with the newer wavefront that wrote it, or start a new store)"
            )
        for step in migrations:
            if step.version > found:
                _apply(con, step)
        if found < latest or app_id == 0:
            con.execute("UPDATE schema_info SET value = ? WHERE key = 'schema_version'", (str(latest),))
            con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            con.execute(f"PRAGMA user_version = {latest}")
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    return found, latest


def connect(path: str | Path, *, create: bool = True, what: str = "results store") -> sqlite3.Connection:
    """Open the results file at `path`, creating (`create`) or migrating it to :data:`SCHEMA_VERSION`.

    The connection begins ``IMMEDIATE`` transactions (``with con:`` takes the write lock at once) and waits
    up to :data:`BUSY_TIMEOUT_S` for another writer. Raises :class:`SchemaError` with a one-line message
    for a missing or empty file (``create=False``), a directory, a file that is not ours or is too new.
    """
    path = Path(path)
    if path.is_dir():
        raise SchemaError(
            f"{path} is a directory: give the path of a {what} file (e.g. {path / 'wavefront-results.sqlite'})"
        )
    if not create and path.is_file() and path.stat().st_size == 0:  # SQLite would take it as an empty database
        raise SchemaError(f"{path} is an empty file, not a wavefront {what}")
    if not path.exists():
        if not create:
            raise SchemaError(f"no {what} at {path}")
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:
        raise SchemaError(f"cannot open {what} {path}: {exc}") from None
    try:
        migrate(con, path)
    except sqlite3.DatabaseError as exc:
        con.close()
        raise SchemaError(f"{path} is not an SQLite {what} ({exc})") from None
    except BaseException:
        con.close()
        raise
    con.isolation_level = "IMMEDIATE"
    return con


def user_version(con: sqlite3.Connection) -> int:
    return int(con.execute("PRAGMA user_version").fetchone()[0])
