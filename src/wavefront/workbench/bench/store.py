"""The results store: one SQLite file of runs, their measurements and their correctness rows.

Schema (version :data:`SCHEMA_VERSION`, recorded in the ``schema_info`` table and checked on open; a file
of another version is refused with a message saying which):

- ``runs``: one row per run, its provenance (git sha and dirty flag, device name and arch, backend,
  driver, torch/triton/python versions, host, UTC date, label) and run-wide figures (measured copy
  bandwidth, flush size, the device model used for % of peak);
- ``measurements``: one row per (run, op, case, mode, dtype, provider) with the status, how it was timed,
  every sample (JSON list, microseconds per call), the registry's FLOPs and minimal bytes, the achieved
  rates and the peak memory;
- ``correctness``: one row per (run, op, case, dtype): pass/fail and the worst errors.

Measurements are committed one at a time as the harness produces them, so an interrupted run keeps what
it measured. ``export_document`` / ``load_document`` give the same runs as JSON
(``"schema": "wavefront.results/1"``); ``export_csv`` flattens measurements with their run's provenance.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from wavefront.workbench.bench.records import CorrectnessRow, Measurement, RunInfo, StoredRun

SCHEMA_VERSION = 1
DOCUMENT_SCHEMA = "wavefront.results/1"
DEFAULT_PATH = "wavefront-results.sqlite"


class StoreError(ValueError):
    """The file is not a wavefront results store of this schema version, or a run reference is unknown."""


_RUN_COLS = [f.name for f in fields(RunInfo) if f.name != "id"]
_MEAS_COLS = [f.name for f in fields(Measurement)]
_CORR_COLS = [f.name for f in fields(CorrectnessRow)]
_JSON_COLS = {"extra", "dims", "samples_us"}
_BOOL_COLS = {"git_dirty", "passed"}
_SQL_NAMES = {"case": "case_name"}  # CASE is an SQL keyword


def _col(name: str) -> str:
    return _SQL_NAMES.get(name, name)


_DDL = f"""
CREATE TABLE IF NOT EXISTS schema_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, {", ".join(_RUN_COLS)});
CREATE TABLE IF NOT EXISTS measurements (run_id INTEGER NOT NULL REFERENCES runs(id),
    {", ".join(_col(c) for c in _MEAS_COLS)});
CREATE INDEX IF NOT EXISTS measurements_run ON measurements(run_id);
CREATE TABLE IF NOT EXISTS correctness (run_id INTEGER NOT NULL REFERENCES runs(id),
    {", ".join(_col(c) for c in _CORR_COLS)});
CREATE INDEX IF NOT EXISTS correctness_run ON correctness(run_id);
"""


def _to_sql(name: str, value: Any) -> Any:
    if name in _JSON_COLS:
        return json.dumps(value)
    if name in _BOOL_COLS and value is not None:
        return int(bool(value))
    return value


def _from_sql(name: str, value: Any) -> Any:
    if name in _JSON_COLS:
        return json.loads(value) if value is not None else None
    if name in _BOOL_COLS and value is not None:
        return bool(value)
    return value


class ResultStore:
    """A results store at `path` (created if absent). Use as a context manager or call close()."""

    def __init__(self, path: str | Path = DEFAULT_PATH, *, create: bool = True):
        self.path = Path(path)
        if not self.path.exists() and not create:
            raise StoreError(f"no results store at {self.path}")
        if self.path.parent != Path("."):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        try:
            self._check_or_init()
        except Exception:
            self._db.close()
            raise

    def _check_or_init(self) -> None:
        try:
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not an SQLite results store ({exc})") from None
        if "schema_info" not in tables:
            if tables:
                raise StoreError(f"{self.path} is an SQLite file but not a wavefront results store "
                                 f"(tables: {', '.join(sorted(tables))})")
            with self._db:
                self._db.executescript(_DDL)
                self._db.execute("INSERT INTO schema_info VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            return
        row = self._db.execute("SELECT value FROM schema_info WHERE key='schema_version'").fetchone()
        version = int(row[0]) if row else None
        if version != SCHEMA_VERSION:
            raise StoreError(f"{self.path} has results-store schema version {version}; this wavefront reads "
                             f"version {SCHEMA_VERSION} (export it with the wavefront that wrote it, or start "
                             "a new store)")

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("SELECT value FROM schema_info WHERE key='schema_version'").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------------------

    def add_run(self, info: RunInfo) -> int:
        with self._db:
            cur = self._db.execute(f"INSERT INTO runs ({', '.join(_RUN_COLS)}) VALUES "
                                   f"({', '.join('?' for _ in _RUN_COLS)})",
                                   [_to_sql(c, getattr(info, c)) for c in _RUN_COLS])
        info.id = int(cur.lastrowid)
        return info.id

    def update_run(self, info: RunInfo) -> None:
        """Rewrite a run's provenance (e.g. the copy bandwidth once it is measured)."""
        if info.id is None:
            raise StoreError("update_run needs a run that was added (info.id is None)")
        with self._db:
            self._db.execute(f"UPDATE runs SET {', '.join(f'{c}=?' for c in _RUN_COLS)} WHERE id=?",
                             [*(_to_sql(c, getattr(info, c)) for c in _RUN_COLS), info.id])

    def add_measurements(self, run_id: int, rows: Iterable[Measurement]) -> None:
        self._insert("measurements", _MEAS_COLS, run_id, rows)

    def add_correctness(self, run_id: int, rows: Iterable[CorrectnessRow]) -> None:
        self._insert("correctness", _CORR_COLS, run_id, rows)

    def _insert(self, table: str, cols: Sequence[str], run_id: int, rows: Iterable[Any]) -> None:
        sql = (f"INSERT INTO {table} (run_id, {', '.join(_col(c) for c in cols)}) VALUES "
               f"(?, {', '.join('?' for _ in cols)})")
        with self._db:
            self._db.executemany(sql, [[run_id, *(_to_sql(c, getattr(r, c)) for c in cols)] for r in rows])

    def save(self, run: StoredRun) -> int:
        """Add a whole run (provenance, measurements, correctness); returns its new id."""
        run_id = self.add_run(run.info)
        self.add_measurements(run_id, run.measurements)
        self.add_correctness(run_id, run.correctness)
        return run_id

    # -- reading ---------------------------------------------------------------------------------------

    def runs(self) -> list[RunInfo]:
        """Every run's provenance, oldest first."""
        rows = self._db.execute(f"SELECT id, {', '.join(_RUN_COLS)} FROM runs ORDER BY id").fetchall()
        return [RunInfo(**{c: _from_sql(c, v) for c, v in zip(_RUN_COLS, r[1:], strict=True)}, id=r[0])
                for r in rows]

    def load(self, run_id: int) -> StoredRun:
        infos = [r for r in self.runs() if r.id == run_id]
        if not infos:
            raise StoreError(f"no run {run_id} in {self.path}")
        meas = self._select("measurements", _MEAS_COLS, run_id)
        corr = self._select("correctness", _CORR_COLS, run_id)
        return StoredRun(infos[0], [Measurement(**m) for m in meas], [CorrectnessRow(**c) for c in corr])

    def _select(self, table: str, cols: Sequence[str], run_id: int) -> list[dict[str, Any]]:
        rows = self._db.execute(f"SELECT {', '.join(_col(c) for c in cols)} FROM {table} WHERE run_id=? "
                                "ORDER BY rowid", (run_id,)).fetchall()
        return [{c: _from_sql(c, v) for c, v in zip(cols, r, strict=True)} for r in rows]

    def resolve(self, ref: str | int) -> int:
        """A run id from a reference: an id, ``latest``, ``latest~N`` (N runs before the latest), or a
        label (the newest run carrying it)."""
        runs = self.runs()
        if not runs:
            raise StoreError(f"the results store {self.path} holds no runs yet (run `wavefront bench`)")
        text = str(ref)
        if text.isdigit():
            if int(text) not in {r.id for r in runs}:
                raise StoreError(f"no run {text} in {self.path}; runs: {', '.join(str(r.id) for r in runs)}")
            return int(text)
        if text == "latest" or text.startswith("latest~"):
            back = int(text.split("~", 1)[1]) if "~" in text else 0
            if back >= len(runs):
                raise StoreError(f"{text}: the store holds only {len(runs)} run(s)")
            return int(runs[-1 - back].id)
        labelled = [r for r in runs if r.label == text]
        if labelled:
            return int(labelled[-1].id)
        raise StoreError(f"run {text!r} not found: give a run id, 'latest', 'latest~N' or a label")

    # -- export ----------------------------------------------------------------------------------------

    def export_document(self, run_ids: Iterable[int] | None = None) -> dict[str, Any]:
        ids = list(run_ids) if run_ids is not None else [int(r.id) for r in self.runs()]
        return {"schema": DOCUMENT_SCHEMA, "store_schema_version": SCHEMA_VERSION,
                "runs": [self.load(i).as_dict() for i in ids]}

    def export_csv(self, dest: str | Path, run_ids: Iterable[int] | None = None) -> int:
        """One CSV line per measurement with its run's provenance; returns the number of lines."""
        ids = list(run_ids) if run_ids is not None else [int(r.id) for r in self.runs()]
        run_cols = ["id", "created_utc", "label", "git_sha", "git_dirty", "device_name", "arch", "backend",
                    "timing", "driver", "torch", "triton"]
        meas_cols = [c for c in _MEAS_COLS if c not in ("samples_us", "dims")]
        n = 0
        with open(dest, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow([f"run_{c}" for c in run_cols] + meas_cols + ["n_reps", "median_us", "p10_us", "p90_us",
                                                                           "dims"])
            for run_id in ids:
                run = self.load(run_id)
                for m in run.measurements:
                    writer.writerow([getattr(run.info, c) for c in run_cols] + [getattr(m, c) for c in meas_cols]
                                    + [len(m.samples_us), m.median_us, m.p10_us, m.p90_us, json.dumps(m.dims)])
                    n += 1
        return n


def load_document(path: str | Path) -> list[StoredRun]:
    """Runs from a JSON export (``wavefront.results/1``) or from one run's ``wavefront bench --json``."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StoreError(f"cannot read results document {path}: {exc}") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == DOCUMENT_SCHEMA:
        return [StoredRun.from_dict(r) for r in doc["runs"]]
    if isinstance(schema, str) and schema.startswith("wavefront.bench/") and "run" in doc:
        return [StoredRun.from_dict(doc["run"])]
    raise StoreError(f"{path} is not a results document (schema {schema!r}; expected {DOCUMENT_SCHEMA} or "
                     "wavefront.bench/N)")


def open_run(ref: str, store_path: str | Path = DEFAULT_PATH) -> StoredRun:
    """A run from a reference: a JSON results file (its last run), an SQLite store (its latest run),
    ``FILE.sqlite:REF``, or a run reference in the store at `store_path`."""
    path_part, _, sub = str(ref).partition(".sqlite:")
    if sub:
        with ResultStore(path_part + ".sqlite", create=False) as st:
            return st.load(st.resolve(sub))
    p = Path(ref)
    if p.is_file():
        if p.suffix == ".json":
            runs = load_document(p)
            if not runs:
                raise StoreError(f"{p} holds no runs")
            return runs[-1]
        with ResultStore(p, create=False) as st:
            return st.load(st.resolve("latest"))
    with ResultStore(store_path, create=False) as st:
        return st.load(st.resolve(ref))


def write_document(store: ResultStore, dest: str | Path, run_ids: Iterable[int] | None = None) -> Path:
    """Export runs as a JSON results document (``wavefront.results/1``) at `dest`."""
    doc = store.export_document(run_ids)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    return dest
