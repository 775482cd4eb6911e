"""What the dashboard shows, gathered from the results store, the registry and other tools' JSON.

- **one roofline** with a device selector (every device in the table): every op x bench case x mode in
  bf16 as a point at its arithmetic intensity and modeled attainable TFLOP/s; measured points only from
  stored GPU runs on that device (achieved TFLOP/s at the same intensity);
- **speedups** of wavefront over each baseline, per case, from the latest GPU run (bootstrap 95% interval);
- **history**: wavefront's median per case across stored GPU runs;
- **correctness** of the latest run, CPU-interpreter wall times (labelled: not performance figures);
- the **inspect** heat map (kernel x target) and **traffic** bars (ours / minimum / eager) from their JSON
  documents: those given, else the newest ones stored with a run (``ResultStore.add_document``);
- the **fused-loss memory** result (``wavefront.lce_memory/1`` files under ``benchmarks/results/``).

Only ``complete`` runs feed the charts; incomplete and failed runs are listed, marked, and left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from wavefront.ops import REGISTRY
from wavefront.workbench.bench.model import Modeled, model_case
from wavefront.workbench.bench.providers import BASELINES
from wavefront.workbench.bench.records import StoredRun
from wavefront.workbench.bench.runnable import modes_for
from wavefront.workbench.bench.store import ResultStore
from wavefront.workbench.distributed.train.store import has_training, read_runs, read_steps
from wavefront.workbench.hardware import GPUS, get_gpu, gpu_from_device_name
from wavefront.workbench.report import DEFAULT_RESULTS_DIR
from wavefront.workbench.report.tables import (
    LCE_MEMORY,
    Document,
    DocumentError,
    load_document_tables,
    parse_document,
)
from wavefront.workbench.stats import compare


@dataclass
class MeasuredPoint:
    device: str
    run_id: int | None
    op: str
    case: str
    mode: str
    provider: str
    intensity: float
    tflops: float
    median_us: float
    gbps: float | None


@dataclass
class Speedup:
    op: str
    case: str
    mode: str
    dtype: str
    baseline: str
    speedup: float
    ci_low: float | None
    ci_high: float | None
    verdict: str


@dataclass
class HistoryPoint:
    run_id: int
    created_utc: str
    git_sha: str | None
    device: str
    series: str  # op/case/mode/dtype
    median_us: float


@dataclass
class ReportData:
    title: str
    runs: list  # RunInfo, oldest first
    latest: StoredRun | None
    latest_gpu: StoredRun | None
    modeled: dict[str, list[Modeled]]  # device key -> points
    measured: dict[str, list[MeasuredPoint]]
    speedups: list[Speedup]
    history: list[HistoryPoint]
    documents: list[Document] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    correctness_run: StoredRun | None = None  # the newest run that checked correctness
    training_runs: list[dict] = field(default_factory=list)  # `wavefront train` KPIs (table train_runs)
    training_steps: dict[str, list[dict]] = field(default_factory=dict)  # newest run: variant -> steps
    statuses: dict[int, str] = field(default_factory=dict)  # run id -> complete | incomplete | failed
    results_dir: str | None = None  # where the committed results (lce_memory_*.json) were looked for
    previous_correctness: StoredRun | None = None  # the run before correctness_run that checked correctness
    previous_gpu: StoredRun | None = None  # the GPU run before latest_gpu
    target_device: str | None = None  # device-table key the newest run targeted (the roofline's first view)


def committed_results(results_dir: str | Path | None) -> list[Document]:
    """The committed fused-loss memory results (``lce_memory_*.json``) in `results_dir`, oldest name first;
    a file that is not such a document is skipped (the directory holds other results too)."""
    if results_dir is None or not Path(results_dir).is_dir():
        return []
    out = []
    for path in sorted(Path(results_dir).glob("lce_memory_*.json")):
        try:
            doc = load_document_tables(path)
        except DocumentError:
            continue
        if doc.schema == LCE_MEMORY:
            out.append(doc)
    return out


def modeled_points(devices=None, dtype: torch.dtype = torch.bfloat16) -> dict[str, list[Modeled]]:
    out: dict[str, list[Modeled]] = {}
    for key in devices or GPUS:
        gpu = GPUS[key]
        out[key] = [
            model_case(spec, case, dtype, mode, gpu)
            for spec in REGISTRY.values()
            for case in spec.bench_cases
            for mode in modes_for(spec)
            if dtype in spec.dtypes
        ]
    return out


def _device_key(device_name: str) -> str | None:
    try:
        return gpu_from_device_name(device_name).key
    except ValueError:
        return None


def measured_points(gpu_runs: list[StoredRun]) -> tuple[dict[str, list[MeasuredPoint]], list[str]]:
    out: dict[str, list[MeasuredPoint]] = {}
    problems = []
    for run in gpu_runs:
        key = run.info.device_model or _device_key(run.info.device_name)
        if key is None:
            problems.append(
                f"run {run.info.id}: device {run.info.device_name!r} is not in the device table; "
                "its points are left off the rooflines"
            )
            continue
        for m in run.measurements:
            if m.ok and m.tflops is not None and m.min_bytes:
                out.setdefault(key, []).append(
                    MeasuredPoint(
                        key,
                        run.info.id,
                        m.op,
                        m.case,
                        m.mode,
                        m.provider,
                        m.flops / m.min_bytes,
                        m.tflops,
                        m.median_us,
                        m.gbps,
                    )
                )
    return out, problems


def speedups(run: StoredRun) -> list[Speedup]:
    """wavefront vs each baseline, per case of one run (speedup > 1: wavefront faster)."""
    by_case: dict[tuple, dict[str, object]] = {}
    for m in run.measurements:
        if m.ok:
            by_case.setdefault(m.case_key, {})[m.provider] = m
    out = []
    for key, provs in by_case.items():
        ours = provs.get("wavefront")
        if ours is None:
            continue
        for base in BASELINES:
            other = provs.get(base)
            if other is None:
                continue
            c = compare(other.samples_us, ours.samples_us)
            ok = c.ci_low == c.ci_low  # NaN when too few samples
            out.append(
                Speedup(*key, base, c.speedup, 1 / c.ci_high if ok else None, 1 / c.ci_low if ok else None, c.verdict)
            )
    return out


def history(gpu_runs: list[StoredRun]) -> list[HistoryPoint]:
    out = []
    for run in gpu_runs:
        for m in run.measurements:
            if m.ok and m.provider == "wavefront":
                out.append(
                    HistoryPoint(
                        run.info.id,
                        run.info.created_utc,
                        run.info.git_sha,
                        run.info.device_name,
                        f"{m.op}/{m.case}/{m.mode}/{m.dtype}",
                        m.median_us,
                    )
                )
    return out


def build_report_data(
    store_path: str | Path | None,
    documents: list[str | Path] = (),
    *,
    title: str = "wavefront dashboard",
    devices=None,
    results_dir: str | Path | None = DEFAULT_RESULTS_DIR,
) -> ReportData:
    """Everything the dashboard shows. `store_path` None: the modeled charts and the documents alone; a
    path that does not exist or is not a results store raises StoreError. `documents` are checked
    (DocumentError on a schema the dashboard does not show); documents stored with runs fill in the
    schemas not given."""
    runs, loaded, statuses, stored = [], [], {}, {}
    docs = [load_document_tables(p) for p in documents]
    if store_path is not None:
        with ResultStore(store_path, create=False) as st:
            runs = st.runs()
            statuses = st.statuses()
            loaded = [st.load(int(r.id)) for r in runs if statuses[int(r.id)] == "complete"]
            stored = st.documents()
    given, unreadable = {d.schema for d in docs}, []
    for name, (run_id, body) in sorted(stored.items()):
        try:
            doc = parse_document(body, f"{name} (stored with run {run_id})")
        except DocumentError as exc:  # stored by another version of its tool: say so, show the rest
            unreadable.append(f"not shown: {exc}")
            continue
        if doc.schema not in given:
            docs.append(doc)
    docs += [d for d in committed_results(results_dir) if d.source not in {x.source for x in docs}]
    gpu_runs = [r for r in loaded if r.info.is_gpu]
    measured, problems = measured_points(gpu_runs)
    data = ReportData(
        title,
        runs,
        loaded[-1] if loaded else None,
        gpu_runs[-1] if gpu_runs else None,
        modeled_points(devices),
        measured,
        speedups(gpu_runs[-1]) if gpu_runs else [],
        history(gpu_runs),
        docs,
        problems + unreadable,
        next((r for r in reversed(loaded) if r.correctness), None),
    )
    data.statuses = statuses
    data.results_dir = str(results_dir) if results_dir is not None else None
    checked = [r for r in loaded if r.correctness]
    data.previous_correctness = checked[-2] if len(checked) > 1 else None
    data.previous_gpu = gpu_runs[-2] if len(gpu_runs) > 1 else None
    data.target_device = target_device(loaded, list(data.modeled))
    if store_path is not None:
        data.training_runs, data.training_steps = training(store_path)
    return data


def target_device(runs: list[StoredRun], keys: list[str]) -> str | None:
    """The device-table key the newest run targeted: its --device-model (a CPU run's modeled roofline, a GPU
    run's % of peak), else the table row of the GPU it ran on; None when no run names one."""
    for run in reversed(runs):
        for name, lookup in ((run.info.device_model, get_gpu),
                             (run.info.device_name if run.info.is_gpu else None, gpu_from_device_name)):
            try:
                key = lookup(name).key if name else None
            except (KeyError, ValueError):
                key = None
            if key in keys:
                return key
    return None


def training(store_path: str | Path) -> tuple[list[dict], dict[str, list[dict]]]:
    """`wavefront train` runs stored beside the benchmarks, and the newest run's per-step rows."""
    if not has_training(store_path):
        return [], {}
    runs = read_runs(store_path)
    newest = runs[-1]["run_id"] if runs else None
    steps = {r["variant"]: read_steps(store_path, newest, r["variant"]) for r in runs if r["run_id"] == newest}
    return runs, steps
