"""Kernel efficiencies measured on the target GPU, read from a `wavefront bench` results store.

`wavefront plan --calibrate STORE` replaces the published curves' constants with what the kernels reached
on the GPU the plan is for. The store is the SQLite file of workbench/bench/store.py (schema versions
1-2 of workbench/sqlite_schema.py); it is read here, read-only, with the sqlite3 module and nothing else,
so the planner stays torch-free. Tables used: `schema_info` (the version), `runs` (id, device_name,
device_model = the device-table key, timing, and from schema 2 status) and `measurements` (op,
case_name, mode, dtype, provider, status, dims as JSON, samples_us as JSON, flops, min_bytes). Only
finished runs timed on a GPU (`timing = "gpu"`) calibrate: CPU-interpreter timings are not performance
figures, and a run marked incomplete or failed (schema 2) is skipped.

From the newest GPU run (or the one named), per (op, case, mode, dtype) the fastest provider that
measured it (what a stack can get: cuBLAS through eager for a GEMM, our kernel for a norm), median of its
samples:

- gemm: `linear` forward in bf16, compute-bound cases (FLOPs per minimal byte above the device's ridge
  point): achieved FLOP/s / (bf16 dense peak x the tile/wave quantization of kernels.py for its M, N),
  median over the cases: the constant kernels.gemm_s multiplies;
- attention: `attention` in bf16, fwd_bwd (forward alone when no fwd_bwd was timed): achieved FLOP/s /
  (bf16 peak x kernels.attention_curve(seq, head_dim)), median: the 16K-token d128 fraction the
  planner's curve scales;
- hbm: the memory-bound ops (FLOPs per minimal byte under 10: norms, softmax, losses, gated activations,
  RoPE, AdamW), achieved minimal bytes per second / the datasheet HBM bandwidth, median (capped at 1).

A constant with no usable measurement keeps its published value; `sources` says which came from where.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wavefront.workbench.hardware import GPU, get_gpu
from wavefront.workbench.planner.kernels import attention_curve, wave_quantization
from wavefront.workbench.planner.training import Efficiency

STORE_SCHEMA_VERSIONS = (1, 2)  # the results-file versions whose tables this reader knows
MEMORY_BOUND_INTENSITY = 10.0  # FLOPs per minimal byte below which an op is memory-bound
_NOT_KERNELS = ("linear", "attention", "linear_cross_entropy")


@dataclass(frozen=True)
class KernelCalibration:
    """Efficiencies measured in one run of a results store (module docstring)."""

    path: str
    run_id: int
    device_name: str
    device_model: str
    gemm: float | None = None
    attention: float | None = None
    hbm: float | None = None
    n_cases: dict[str, int] = field(default_factory=dict)

    def apply(self, base: Efficiency) -> Efficiency:
        """`base` with the measured constants in place of the published ones."""
        measured = {k: round(min(v, 1.0), 4) for k in ("gemm", "attention", "hbm")
                    if (v := getattr(self, k)) is not None and v > 0}
        return replace(base, **measured, attention_as_is=base.attention_as_is or "attention" in measured,
                       source=f"{base.source}; {', '.join(measured)} measured in {self.path} "
                              f"run {self.run_id} on {self.device_name}")

    def sources(self, base: Efficiency) -> dict[str, str]:
        """Which constant came from where: the store (with the number of cases) or the published fit."""
        out = {}
        for k in ("gemm", "attention", "hbm"):
            if getattr(self, k) is not None:
                out[k] = f"measured: {self.path} run {self.run_id} ({self.device_name}), {self.n_cases[k]} case(s)"
            else:
                out[k] = f"published: {base.source} (no usable {k} measurement in {self.path})"
        return out


def _open(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise ValueError(f"--calibrate: no results store at {path}")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"schema_info", "runs", "measurements"} <= tables:
            raise ValueError(f"--calibrate: {path} is not a `wavefront bench` results store (tables: "
                             f"{', '.join(sorted(tables)) or 'none'})")
        row = db.execute("SELECT value FROM schema_info WHERE key='schema_version'").fetchone()
        if row is None or int(row[0]) not in STORE_SCHEMA_VERSIONS:
            raise ValueError(f"--calibrate: {path} has results-store schema version {row[0] if row else None}; "
                             f"the planner reads versions {', '.join(map(str, STORE_SCHEMA_VERSIONS))}")
    except sqlite3.DatabaseError as exc:
        db.close()
        raise ValueError(f"--calibrate: {path} is not an SQLite results store ({exc})") from None
    except ValueError:
        db.close()
        raise
    return db


def _pick_run(db: sqlite3.Connection, path: Path, run_id: int | None) -> tuple[int, str, str]:
    columns = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
    status = "status" if "status" in columns else "'complete'"
    rows = db.execute(f"SELECT id, device_name, device_model, timing FROM runs WHERE {status} = 'complete' "
                      "ORDER BY id").fetchall()
    if run_id is not None:
        rows = [r for r in rows if r[0] == run_id]
        if not rows:
            raise ValueError(f"--calibrate: no finished run {run_id} in {path}")
    gpu_rows = [r for r in rows if r[3] == "gpu"]
    if not gpu_rows:
        raise ValueError(f"--calibrate: {path} holds no run timed on a GPU (CPU-interpreter timings are not "
                         "performance figures); run `wavefront bench` on the target GPU")
    rid, name, model, _ = gpu_rows[-1]
    if not model:
        raise ValueError(f"--calibrate: run {rid} of {path} does not name its device-table GPU (device_model)")
    return rid, name, model


def _fastest(db: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Per (op, case, mode, dtype): the fastest provider's median microseconds, FLOPs, bytes and dims."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for op, case, mode, dtype, status, dims, samples, flops, n_bytes in db.execute(
            "SELECT op, case_name, mode, dtype, status, dims, samples_us, flops, min_bytes FROM measurements "
            "WHERE run_id=?", (run_id,)):
        times = json.loads(samples) if samples else []
        if status != "ok" or not times:
            continue
        median_us = statistics.median(times)
        if median_us <= 0:
            continue
        key = (op, case, mode, dtype)
        if key not in best or median_us < best[key]["median_us"]:
            best[key] = {"op": op, "mode": mode, "dtype": dtype, "dims": json.loads(dims) if dims else {},
                         "median_us": median_us, "flops": float(flops or 0.0), "bytes": float(n_bytes or 0)}
    return list(best.values())


def _efficiencies(rows: list[dict[str, Any]], gpu: GPU) -> tuple[dict[str, float], dict[str, int]]:
    peak = gpu.peak_tflops("bf16") * 1e12
    ridge = peak / (gpu.hbm_tbps * 1e12)
    gemm: list[float] = []
    attn_bwd: list[float] = []
    attn_fwd: list[float] = []
    hbm: list[float] = []
    for r in rows:
        rate = r["flops"] / (r["median_us"] * 1e-6)
        d = r["dims"]
        if r["op"] == "linear" and r["mode"] == "fwd" and r["dtype"] == "bf16" and r["bytes"] > 0 \
                and r["flops"] / r["bytes"] > ridge and {"M", "N"} <= set(d):
            gemm.append(rate / (peak * wave_quantization(gpu, d["M"], d["N"])))
        elif r["op"] == "attention" and r["dtype"] == "bf16" and {"seq", "head_dim"} <= set(d):
            frac = rate / (peak * attention_curve(d["seq"], d["head_dim"]))
            if r["mode"] == "fwd_bwd":
                attn_bwd.append(frac)
            elif r["mode"] == "fwd":
                attn_fwd.append(frac)
        elif r["op"] not in _NOT_KERNELS and r["bytes"] > 0 and r["flops"] / r["bytes"] < MEMORY_BOUND_INTENSITY:
            hbm.append(r["bytes"] / (r["median_us"] * 1e-6) / (gpu.hbm_tbps * 1e12))
    attn = attn_bwd or attn_fwd
    found = {"gemm": gemm, "attention": attn, "hbm": hbm}
    return ({k: statistics.median(v) for k, v in found.items() if v}, {k: len(v) for k, v in found.items()})


def load_kernel_calibration(path: str | Path, gpu_key: str, run_id: int | None = None) -> KernelCalibration:
    """Read the newest GPU run of a results store (or run `run_id`) measured on `gpu_key`."""
    p = Path(path)
    db = _open(p)
    try:
        rid, name, model = _pick_run(db, p, run_id)
        if model != gpu_key:
            raise ValueError(f"--calibrate: run {rid} of {p} was measured on {model} ({name}); the cluster's GPU "
                             f"is {gpu_key}: calibrate with a store measured on the target GPU")
        effs, counts = _efficiencies(_fastest(db, rid), get_gpu(model))
    finally:
        db.close()
    if not effs:
        raise ValueError(f"--calibrate: run {rid} of {p} has no usable bf16 linear, attention or memory-bound "
                         "measurement")
    return KernelCalibration(str(p), rid, name, model, effs.get("gemm"), effs.get("attention"), effs.get("hbm"),
                             counts)
