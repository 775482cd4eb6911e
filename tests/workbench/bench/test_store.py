"""The results store: round trip, schema migrations, concurrent creation, run status, run references,
stored documents, JSON/CSV export."""

from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wavefront.workbench.bench.records import CorrectnessRow, Measurement, RunInfo, StoredRun
from wavefront.workbench.bench.store import (
    SCHEMA_VERSION,
    ResultStore,
    StoreError,
    load_document,
    open_run,
    write_document,
)
from wavefront.workbench.distributed.train.store import read_runs, read_steps, write_variant


def make_run(
    label="r", samples=(10.0, 11.0, 12.0), device="NVIDIA H100 80GB HBM3", timing="gpu", mem=1 << 20
) -> StoredRun:
    info = RunInfo(
        created_utc="2026-01-02T03:04:05Z",
        label=label,
        git_sha="a" * 40,
        git_dirty=True,
        device_name=device,
        arch="sm_90",
        backend="cuda",
        torch="2.13.0",
        triton="3.9.0",
        python="3.11.7",
        host="h",
        timing=timing,
        driver="12.8",
        copy_gbps=4100.0,
        flush_bytes=512 << 20,
        device_model="h100",
        extra={"note": "test fixture"},
    )
    m = Measurement(
        "rms_norm",
        "llama3-8b_hidden",
        "fwd",
        "bf16",
        "wavefront",
        "ok",
        "",
        {"n_rows": 32768, "n_cols": 4096},
        "events",
        "flush 512 MiB",
        5,
        1,
        list(samples),
        1e9,
        537_000_000,
        gbps=3000.0,
        tflops=5.5,
        pct_peak_bw=89.5,
        pct_peak_flops=0.5,
        pct_copy_bw=73.1,
        peak_mem_bytes=mem,
        max_diff_vs_eager=0.0,
    )
    u = Measurement("rms_norm", "llama3-8b_hidden", "fwd", "bf16", "liger", "unavailable", "not installed")
    c = CorrectnessRow("rms_norm", "npow2", "bf16", True, None, 1e-3, 1e-3, 3e-3, 2e-3, 2e-3, 5e-3, 0.5)
    return StoredRun(info, [m, u], [c])


def test_round_trip(tmp_path):
    run = make_run()
    with ResultStore(tmp_path / "r.sqlite") as st:
        run_id = st.save(run)
        assert st.schema_version == SCHEMA_VERSION
    with ResultStore(tmp_path / "r.sqlite", create=False) as st:
        back = st.load(run_id)
    assert back.info == run.info  # id was set by save
    assert back.measurements == run.measurements
    assert back.correctness == run.correctness
    assert back.measurements[0].median_us == 11.0 and back.info.git_dirty is True


def test_newer_schema_is_refused_naming_both_versions(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match=f"schema version 99; this wavefront reads versions up to {SCHEMA_VERSION}"):
        ResultStore(path)


# The results file as wavefront wrote it before PRAGMA user_version (schema 1): the DDL of that release,
# written out here so the test does not depend on the code under test.
_OLD_DDL = """
CREATE TABLE IF NOT EXISTS schema_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, created_utc, label, git_sha, git_dirty,
    device_name, arch, backend, torch, triton, python, host, timing, driver, copy_gbps, flush_bytes, device_model,
    extra);
CREATE TABLE IF NOT EXISTS measurements (run_id INTEGER NOT NULL REFERENCES runs(id), op, case_name, mode, dtype,
    provider, status, reason, dims, method, flush, n_warmup, calls_per_sample, samples_us, flops, min_bytes, gbps,
    tflops, pct_peak_bw, pct_peak_flops, pct_copy_bw, peak_mem_bytes, max_diff_vs_eager);
CREATE INDEX IF NOT EXISTS measurements_run ON measurements(run_id);
CREATE TABLE IF NOT EXISTS correctness (run_id INTEGER NOT NULL REFERENCES runs(id), op, case_name, dtype, passed,
    error, fwd_err_ours, fwd_err_eager, fwd_bound, bwd_err_ours, bwd_err_eager, bwd_bound, wall_s);
CREATE INDEX IF NOT EXISTS correctness_run ON correctness(run_id);
INSERT INTO schema_info VALUES ('schema_version', '1');
"""
_OLD_TRAIN_DDL = """
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
INSERT INTO train_runs (run_id, variant, started_at, status, model, tokens_per_s, schema_version)
    VALUES ('t1', 'baseline', '2026-01-01T00:00:00Z', 'ok', 'tiny', 123.0, 1);
INSERT INTO train_steps (run_id, variant, step, loss, measured) VALUES ('t1', 'baseline', 0, 4.5, 0);
"""


def _old_store(path: Path, *, with_training: bool) -> None:
    db = sqlite3.connect(path)
    db.executescript(_OLD_DDL + (_OLD_TRAIN_DDL if with_training else ""))
    run = make_run()
    cols = "created_utc, label, git_sha, git_dirty, device_name, arch, backend, torch, triton, python, host, timing"
    db.execute(
        f"INSERT INTO runs ({cols}, extra) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (*(getattr(run.info, c.strip()) for c in cols.split(",")), "{}"),
    )
    db.execute(
        "INSERT INTO measurements (run_id, op, case_name, mode, dtype, provider, status, reason, dims, "
        "samples_us, flops, min_bytes) VALUES (1, 'rms_norm', 'c', 'fwd', 'bf16', 'wavefront', 'ok', '', "
        "'{}', '[1.0, 2.0, 3.0]', 10.0, 20)"
    )
    db.execute(
        f"INSERT INTO runs ({cols}, extra) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",  # interrupted: no rows
        (*(getattr(run.info, c.strip()) for c in cols.split(",")), "{}"),
    )
    db.commit()
    db.close()


@pytest.mark.parametrize("with_training", [False, True], ids=["bench-only", "bench+train"])
def test_previous_schema_is_migrated_in_place(tmp_path, with_training):
    path = tmp_path / "old.sqlite"
    _old_store(path, with_training=with_training)
    with ResultStore(path, create=False) as st:
        assert st.schema_version == SCHEMA_VERSION == 2
        run = st.load(1)
        assert run.measurements[0].samples_us == [1.0, 2.0, 3.0] and run.info.label == "r"
        assert st.statuses() == {1: "complete", 2: "incomplete"}  # the empty old run was an interrupted one
        assert st.resolve("latest") == 1
        run_id = st.save(make_run(label="new"))  # the migrated file takes new runs
        assert st.resolve("latest") == run_id
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM schema_info").fetchone() == ("2",)  # what an older wavefront checks
    db.close()
    if with_training:
        assert [r["tokens_per_s"] for r in read_runs(path)] == [123.0]
        assert [s["loss"] for s in read_steps(path, "t1", "baseline")] == [4.5]
    with ResultStore(path, create=False) as st:  # a second open changes nothing
        assert st.schema_version == 2 and len(st.runs()) == 3


def test_training_store_migrates_an_old_file_and_shares_the_schema(tmp_path):
    path = tmp_path / "old.sqlite"
    _old_store(path, with_training=True)
    write_variant(
        path,
        run_id="t2",
        variant="wavefront",
        status="ok",
        provenance={"started_at": "2026-01-02"},
        config={"model": "tiny"},
        summary={"tokens_per_s": 9.0},
        steps=[],
    )
    assert [r["run_id"] for r in read_runs(path)] == ["t1", "t2"]
    with ResultStore(path, create=False) as st:
        assert st.schema_version == SCHEMA_VERSION and st.statuses()[1] == "complete"
    fresh = tmp_path / "fresh.sqlite"  # the training store creating the file makes a full results store
    write_variant(fresh, run_id="t", variant="v", status="ok", provenance={}, config={}, summary=None, steps=[])
    with ResultStore(fresh, create=False) as st:
        assert st.schema_version == SCHEMA_VERSION and st.runs() == []


def test_schema_columns_cover_the_records(tmp_path):
    """A field added to RunInfo / Measurement / CorrectnessRow needs a migration step adding its column."""
    from dataclasses import fields

    from wavefront.workbench.bench.records import CorrectnessRow, Measurement, RunInfo

    with ResultStore(tmp_path / "r.sqlite") as st:
        cols = {
            t: {r[1] for r in st._db.execute(f"PRAGMA table_info({t})")}
            for t in ("runs", "measurements", "correctness")
        }
    rename = {"case": "case_name"}
    for table, record in (("runs", RunInfo), ("measurements", Measurement), ("correctness", CorrectnessRow)):
        missing = {rename.get(f.name, f.name) for f in fields(record)} - cols[table]
        assert not missing, f"{table} lacks {missing}: add a migration step"


_CREATOR = """
import sys, threading, time
from wavefront.workbench.bench.records import RunInfo
from wavefront.workbench.bench.store import ResultStore
path, start, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
errors, ready = [], threading.Barrier(n)
def open_and_add(i):
    ready.wait()
    while time.time() < start:  # every thread of every process opens at the same instant
        pass
    try:
        with ResultStore(path) as st:
            st.add_run(RunInfo("2026-01-01T00:00:00Z", f"t{i}", None, None, "cpu", "cpu", "cpu", "t", None, "py", "h"))
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
threads = [threading.Thread(target=open_and_add, args=(i,)) for i in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(errors), *errors[:1])
"""


def test_concurrent_creation_of_one_store(tmp_path):
    """4 processes x 10 connections open one new path at the same instant: all 40 succeed and one schema
    results. (Before the migrations module, this setup failed 57 of 120 opens over three tries with
    "schema version None": one process saw the schema half created by another.)"""
    path = tmp_path / "shared.sqlite"
    start = time.time() + 1.0  # every process imported and waiting before the first open
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATOR, str(path), str(start), "10"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-500:] for _, err in outputs]
    assert [out.split(" ", 1)[0].strip() for out, _ in outputs] == ["0"] * 4, [out for out, _ in outputs]
    with ResultStore(path, create=False) as st:
        assert len(st.runs()) == 40 and st.schema_version == SCHEMA_VERSION
        assert st._db.execute("SELECT count(*) FROM schema_info").fetchone()[0] == 1


def test_run_status_and_latest_skip_interrupted_runs(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as st:
        done = st.save(make_run(label="done"))
        interrupted = st.begin_run(make_run(label="cut").info)  # bench killed before finish_run
        assert st.run_status(interrupted) == "incomplete"
        assert st.resolve("latest") == done
        assert st.resolve(str(interrupted)) == interrupted  # an explicit id still reaches it
        with pytest.raises(StoreError, match="1 incomplete or failed run"):
            st.resolve("latest~1")
        with pytest.raises(StoreError, match="every run with that label is incomplete"):
            st.resolve("cut")
        third = st.begin_run(make_run(label="ok").info)
        st.finish_run(third)
        assert st.resolve("latest") == third and st.resolve("latest~1") == done
        st.finish_run(third, "failed")
        assert st.resolve("latest") == done
        assert st.statuses() == {done: "complete", interrupted: "incomplete", third: "failed"}
        with pytest.raises(StoreError, match="run status must be one of complete, incomplete, failed"):
            st.finish_run(done, "ok")
        with pytest.raises(StoreError, match="no run 99"):
            st.finish_run(99)
    assert open_run(str(tmp_path / "r.sqlite")).info.label == "done"  # what the gate reads


def test_an_exception_leaving_the_store_marks_its_unfinished_runs(tmp_path):
    """An interrupted `bench` (Ctrl-C inside `with ResultStore(...)`) leaves its run marked, not counted."""
    path = tmp_path / "r.sqlite"
    with ResultStore(path) as st:
        done = st.save(make_run(label="done"))
    with pytest.raises(KeyboardInterrupt), ResultStore(path) as st:
        cut = st.add_run(make_run(label="cut").info)
        sealed = st.add_run(make_run(label="sealed").info)
        st.finish_run(sealed)
        raise KeyboardInterrupt
    with ResultStore(path) as st:
        assert st.statuses() == {done: "complete", cut: "incomplete", sealed: "complete"}
        assert st.resolve("latest") == sealed and st.resolve("latest~1") == done
    with ResultStore(path) as st:  # leaving normally changes nothing
        quiet = st.add_run(make_run().info)
    with ResultStore(path) as st:
        assert st.run_status(quiet) == "complete"


def test_documents_are_kept_with_their_run(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as st:
        one, two = st.save(make_run()), st.save(make_run())
        st.add_document(one, "inspect", {"schema": "wavefront.inspect/1", "rows": [1]})
        st.add_document(one, "traffic", {"schema": "wavefront.traffic/1", "rows": []})
        st.add_document(two, "inspect", {"schema": "wavefront.inspect/1", "rows": [2]})
        newest = st.documents()
        assert newest["inspect"] == (two, {"schema": "wavefront.inspect/1", "rows": [2]})
        assert newest["traffic"][0] == one
        assert st.documents(one)["inspect"][1]["rows"] == [1]
        with pytest.raises(StoreError, match="no run 7"):
            st.add_document(7, "inspect", {})
        with pytest.raises(StoreError, match="must be a JSON object"):
            st.add_document(one, "inspect", [1, 2])


def test_foreign_sqlite_and_missing_store_are_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(StoreError, match="not a wavefront results store"):
        ResultStore(path)
    with pytest.raises(StoreError, match="no results store"):
        ResultStore(tmp_path / "absent.sqlite", create=False)
    (tmp_path / "junk.sqlite").write_text("not a database at all" * 100)
    with pytest.raises(StoreError, match="not an SQLite results store"):
        ResultStore(tmp_path / "junk.sqlite")
    with pytest.raises(StoreError, match="is a directory: give the path of a results store file"):
        ResultStore(tmp_path)
    other_app = tmp_path / "app.sqlite"
    db = sqlite3.connect(other_app)
    db.execute("PRAGMA application_id = 7")
    db.close()
    with pytest.raises(StoreError, match="another application"):
        ResultStore(other_app)


def test_run_references(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as st:
        with pytest.raises(StoreError, match="holds no runs"):
            st.resolve("latest")
        ids = [st.save(make_run(label=f"L{i}")) for i in range(3)]
        assert st.resolve("latest") == ids[2]
        assert st.resolve("latest~2") == ids[0]
        assert st.resolve(str(ids[1])) == ids[1]
        assert st.resolve("L1") == ids[1]
        for bad in ("latest~3", "999", "nope"):
            with pytest.raises(StoreError):
                st.resolve(bad)


def test_json_and_csv_export(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as st:
        st.save(make_run(label="one"))
        st.save(make_run(label="two", samples=(20.0, 21.0)))
        path = write_document(st, tmp_path / "out" / "runs.json")
        n = st.export_csv(tmp_path / "m.csv")
    doc = json.loads(path.read_text())
    assert doc["schema"] == "wavefront.results/1" and doc["store_schema_version"] == SCHEMA_VERSION
    assert [r["status"] for r in doc["runs"]] == ["complete", "complete"]
    runs = load_document(path)
    assert [r.info.label for r in runs] == ["one", "two"]
    assert runs[1].measurements[0].samples_us == [20.0, 21.0]
    assert open_run(str(path)).info.label == "two"
    assert open_run(str(tmp_path / "r.sqlite")).info.label == "two"
    assert open_run(f"{tmp_path / 'r.sqlite'}:one").info.label == "one"
    assert n == 4
    rows = list(csv.DictReader((tmp_path / "m.csv").read_text().splitlines()))
    assert rows[0]["run_label"] == "one" and float(rows[0]["median_us"]) == 11.0
    assert rows[1]["status"] == "unavailable" and rows[1]["median_us"] == ""


def test_not_a_results_document(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"schema": "wavefront.inspect/1", "kernels": []}))
    with pytest.raises(StoreError, match="not a results document"):
        load_document(tmp_path / "x.json")
