"""The results store: one SQLite file of runs, their measurements, correctness rows and documents.

The file's schema and its migrations live in wavefront.workbench.sqlite_schema (shared with the training
store, whose tables sit in the same file): opening an older file migrates it, a newer one is refused with
both versions named, and creation is atomic when several processes open a new path at once.

- ``runs``: one row per run, its provenance (git sha and dirty flag, device name and arch, backend,
  driver, torch/triton/python versions, host, UTC date, label), run-wide figures (measured copy
  bandwidth, flush size, the device model used for % of peak) and its ``status`` (:data:`RUN_STATUSES`);
- ``measurements``: one row per (run, op, case, mode, dtype, provider) with the status, how it was timed,
  every sample (JSON list, microseconds per call), the registry's FLOPs and minimal bytes, the achieved
  rates and the peak memory;
- ``correctness``: one row per (run, op, case, dtype): pass/fail and the worst errors;
- ``documents``: JSON documents a run produced (``inspect``, ``traffic``), so the dashboard shows them later.

A run written row by row starts with :meth:`ResultStore.begin_run` (status ``incomplete``) and ends with
:meth:`ResultStore.finish_run`; measurements are committed one group at a time, so an interrupted run
keeps what it measured and stays marked ``incomplete`` even if the process is killed. A run added with
:meth:`ResultStore.add_run` inside ``with ResultStore(...)`` is marked ``incomplete`` when an exception
(Ctrl-C included) leaves the block before :meth:`ResultStore.finish_run` sealed it. Run references
(``latest``, ``latest~N``, a label) resolve among ``complete`` runs only; an id reaches any run. ``export_document`` /
``load_document`` give the same runs as JSON (``"schema": "wavefront.results/1"``); ``export_csv``
flattens measurements with their run's provenance.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from wavefront.workbench import sqlite_schema
from wavefront.workbench.bench.records import CorrectnessRow, Measurement, RunInfo, StoredRun
from wavefront.workbench.document import encode

SCHEMA_VERSION = sqlite_schema.SCHEMA_VERSION
DOCUMENT_SCHEMA = "wavefront.results/1"
DEFAULT_PATH = "wavefront-results.sqlite"
RUN_COMPLETE, RUN_INCOMPLETE, RUN_FAILED = "complete", "incomplete", "failed"
RUN_STATUSES = (RUN_COMPLETE, RUN_INCOMPLETE, RUN_FAILED)


class StoreError(ValueError):
    """The file is not a wavefront results store this wavefront reads, or a run reference is unknown."""


_RUN_COLS = [f.name for f in fields(RunInfo) if f.name != "id"]
_MEAS_COLS = [f.name for f in fields(Measurement)]
_CORR_COLS = [f.name for f in fields(CorrectnessRow)]
_JSON_COLS = {"extra", "dims", "samples_us"}
_BOOL_COLS = {"git_dirty", "passed"}
_SQL_NAMES = {"case": "case_name"}  # CASE is an SQL keyword


def _col(name: str) -> str:
    return _SQL_NAMES.get(name, name)


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
        try:
            self._db = sqlite_schema.connect(self.path, create=create)
            self._unsealed: set[int] = set()  # runs added here and not passed to finish_run
        except sqlite_schema.SchemaError as exc:
            raise StoreError(str(exc)) from None

    @property
    def schema_version(self) -> int:
        return sqlite_schema.user_version(self._db)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Leaving the ``with`` block on an exception (Ctrl-C included) marks the runs added through this
        store and not finished explicitly ``incomplete``: what they hold may be partial."""
        try:
            if exc_type is not None and self._unsealed:
                with self._db:
                    self._db.executemany(
                        "UPDATE runs SET status=? WHERE id=?", [(RUN_INCOMPLETE, i) for i in sorted(self._unsealed)]
                    )
        finally:
            self.close()

    # -- writing ---------------------------------------------------------------------------------------

    def add_run(self, info: RunInfo, *, status: str = RUN_COMPLETE) -> int:
        """Add a run's provenance; returns its id (also set on `info`). A run written row by row should use
        :meth:`begin_run` and :meth:`finish_run` instead, so that an interruption leaves it marked."""
        _check_status(status)
        with self._db:
            cur = self._db.execute(
                f"INSERT INTO runs ({', '.join(_RUN_COLS)}, status) VALUES ({', '.join('?' for _ in _RUN_COLS)}, ?)",
                [*(_to_sql(c, getattr(info, c)) for c in _RUN_COLS), status],
            )
        info.id = int(cur.lastrowid)
        self._unsealed.add(info.id)
        return info.id

    def begin_run(self, info: RunInfo) -> int:
        """Add a run marked ``incomplete``: it stays so (and out of ``latest``) until :meth:`finish_run`."""
        return self.add_run(info, status=RUN_INCOMPLETE)

    def finish_run(self, run_id: int, status: str = RUN_COMPLETE) -> None:
        """Mark a run ``complete`` (or ``failed``: it ended but its results should not be gated on)."""
        _check_status(status)
        with self._db:
            cur = self._db.execute("UPDATE runs SET status=? WHERE id=?", (status, run_id))
        if cur.rowcount != 1:
            raise StoreError(f"no run {run_id} in {self.path}")
        self._unsealed.discard(run_id)

    def run_status(self, run_id: int) -> str:
        row = self._db.execute("SELECT status FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id} in {self.path}")
        return str(row[0])

    def statuses(self) -> dict[int, str]:
        """Every run's status by id."""
        return {int(i): str(s) for i, s in self._db.execute("SELECT id, status FROM runs ORDER BY id")}

    def add_document(self, run_id: int, name: str, doc: dict[str, Any]) -> None:
        """Keep a JSON document a run produced (e.g. name ``inspect`` or ``traffic``); replaces one of the
        same name for that run."""
        if not isinstance(doc, dict):
            raise StoreError(f"document {name!r} must be a JSON object, got {type(doc).__name__}")
        self.run_status(run_id)  # the run must exist
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO documents (run_id, name, schema, body) VALUES (?, ?, ?, ?)",
                (run_id, name, doc.get("schema"), json.dumps(doc, allow_nan=True)),
            )

    def documents(self, run_id: int | None = None) -> dict[str, tuple[int, dict[str, Any]]]:
        """Stored documents by name, each with the id of the run that stored it: those of `run_id`, or by
        default the newest of each name across runs."""
        where, args = ("WHERE run_id=?", (run_id,)) if run_id is not None else ("", ())
        out: dict[str, tuple[int, dict[str, Any]]] = {}
        for rid, name, body in self._db.execute(
            f"SELECT run_id, name, body FROM documents {where} ORDER BY run_id", args
        ):
            out[name] = (int(rid), json.loads(body))
        return out

    def update_run(self, info: RunInfo) -> None:
        """Rewrite a run's provenance (e.g. the copy bandwidth once it is measured)."""
        if info.id is None:
            raise StoreError("update_run needs a run that was added (info.id is None)")
        with self._db:
            self._db.execute(
                f"UPDATE runs SET {', '.join(f'{c}=?' for c in _RUN_COLS)} WHERE id=?",
                [*(_to_sql(c, getattr(info, c)) for c in _RUN_COLS), info.id],
            )

    def add_measurements(self, run_id: int, rows: Iterable[Measurement]) -> None:
        self._insert("measurements", _MEAS_COLS, run_id, rows)

    def add_correctness(self, run_id: int, rows: Iterable[CorrectnessRow]) -> None:
        self._insert("correctness", _CORR_COLS, run_id, rows)

    def _insert(self, table: str, cols: Sequence[str], run_id: int, rows: Iterable[Any]) -> None:
        sql = (
            f"INSERT INTO {table} (run_id, {', '.join(_col(c) for c in cols)}) VALUES "
            f"(?, {', '.join('?' for _ in cols)})"
        )
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
        return [RunInfo(**{c: _from_sql(c, v) for c, v in zip(_RUN_COLS, r[1:], strict=True)}, id=r[0]) for r in rows]

    def load(self, run_id: int) -> StoredRun:
        infos = [r for r in self.runs() if r.id == run_id]
        if not infos:
            raise StoreError(f"no run {run_id} in {self.path}")
        meas = self._select("measurements", _MEAS_COLS, run_id)
        corr = self._select("correctness", _CORR_COLS, run_id)
        return StoredRun(infos[0], [Measurement(**m) for m in meas], [CorrectnessRow(**c) for c in corr])

    def _select(self, table: str, cols: Sequence[str], run_id: int) -> list[dict[str, Any]]:
        rows = self._db.execute(
            f"SELECT {', '.join(_col(c) for c in cols)} FROM {table} WHERE run_id=? ORDER BY rowid", (run_id,)
        ).fetchall()
        return [{c: _from_sql(c, v) for c, v in zip(cols, r, strict=True)} for r in rows]

    def resolve(self, ref: str | int) -> int:
        """A run id from a reference: an id (any status), ``latest``, ``latest~N`` (N complete runs before the
        latest complete one), or a label (the newest complete run carrying it). Incomplete and failed runs
        are skipped by everything but an id."""
        runs = self.runs()
        if not runs:
            raise StoreError(f"the results store {self.path} holds no runs yet (run `wavefront bench`)")
        text = str(ref)
        if text.isdigit():
            if int(text) not in {r.id for r in runs}:
                raise StoreError(f"no run {text} in {self.path}; runs: {', '.join(str(r.id) for r in runs)}")
            return int(text)
        status = self.statuses()
        done = [r for r in runs if status[int(r.id)] == RUN_COMPLETE]
        skipped = len(runs) - len(done)
        why = f" ({skipped} incomplete or failed run(s) are not counted)" if skipped else ""
        if text == "latest" or text.startswith("latest~"):
            try:
                back = int(text.split("~", 1)[1]) if "~" in text else 0
            except ValueError:
                raise StoreError(f"{text}: expected latest~N with N a whole number") from None
            if back >= len(done):
                raise StoreError(f"{text}: the store holds only {len(done)} complete run(s){why}")
            return int(done[-1 - back].id)
        labelled = [r for r in done if r.label == text]
        if labelled:
            return int(labelled[-1].id)
        if any(r.label == text for r in runs):
            raise StoreError(f"run {text!r}: every run with that label is incomplete or failed; give its id")
        raise StoreError(f"run {text!r} not found: give a run id, 'latest', 'latest~N' or a label")

    # -- export ----------------------------------------------------------------------------------------

    def export_document(self, run_ids: Iterable[int] | None = None) -> dict[str, Any]:
        ids = list(run_ids) if run_ids is not None else [int(r.id) for r in self.runs()]
        status = self.statuses()
        return {
            "schema": DOCUMENT_SCHEMA,
            "store_schema_version": SCHEMA_VERSION,
            "runs": [encode(self.load(i)) | {"status": status[i]} for i in ids],
        }

    def export_csv(self, dest: str | Path, run_ids: Iterable[int] | None = None) -> int:
        """One CSV line per measurement with its run's provenance; returns the number of lines."""
        ids = list(run_ids) if run_ids is not None else [int(r.id) for r in self.runs()]
        run_cols = [
            "id",
            "created_utc",
            "label",
            "git_sha",
            "git_dirty",
            "device_name",
            "arch",
            "backend",
            "timing",
            "driver",
            "torch",
            "triton",
        ]
        meas_cols = [c for c in _MEAS_COLS if c not in ("samples_us", "dims")]
        n = 0
        with open(dest, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(
                [f"run_{c}" for c in run_cols] + meas_cols + ["n_reps", "median_us", "p10_us", "p90_us", "dims"]
            )
            for run_id in ids:
                run = self.load(run_id)
                for m in run.measurements:
                    writer.writerow(
                        [getattr(run.info, c) for c in run_cols]
                        + [getattr(m, c) for c in meas_cols]
                        + [len(m.samples_us), m.median_us, m.p10_us, m.p90_us, json.dumps(m.dims)]
                    )
                    n += 1
        return n


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise StoreError(f"run status must be one of {', '.join(RUN_STATUSES)}; got {status!r}")


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
    raise StoreError(
        f"{path} is not a results document (schema {schema!r}; expected {DOCUMENT_SCHEMA} or wavefront.bench/N)"
    )


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
