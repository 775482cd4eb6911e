"""The results store: round trip, schema version, run references, JSON/CSV export."""

from __future__ import annotations

import csv
import json
import sqlite3

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


def make_run(label="r", samples=(10.0, 11.0, 12.0), device="NVIDIA H100 80GB HBM3", timing="gpu",
             mem=1 << 20) -> StoredRun:
    info = RunInfo(created_utc="2026-01-02T03:04:05Z", label=label, git_sha="a" * 40, git_dirty=True,
                   device_name=device, arch="sm_90", backend="cuda", torch="2.13.0", triton="3.9.0",
                   python="3.11.7", host="h", timing=timing, driver="12.8", copy_gbps=4100.0,
                   flush_bytes=512 << 20, device_model="h100", extra={"note": "test fixture"})
    m = Measurement("rms_norm", "llama3-8b_hidden", "fwd", "bf16", "wavefront", "ok", "",
                    {"n_rows": 32768, "n_cols": 4096}, "events", "flush 512 MiB", 5, 1, list(samples), 1e9,
                    537_000_000, gbps=3000.0, tflops=5.5, pct_peak_bw=89.5, pct_peak_flops=0.5, pct_copy_bw=73.1,
                    peak_mem_bytes=mem, max_diff_vs_eager=0.0)
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


def test_schema_version_mismatch_is_refused(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultStore(path).close()
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE schema_info SET value='99' WHERE key='schema_version'")
    db.close()
    with pytest.raises(StoreError, match="schema version 99; this wavefront reads version 1"):
        ResultStore(path)


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
