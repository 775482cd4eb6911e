"""Reproduce published training runs with the cost model: per-row error and the median per table.

A published table is a JSON document (tests/data/published/*.json, schema "wavefront.published/1"):
its source (citation, URL, table, how it was transcribed), the hardware, the metric and the convention
the source used to compute it, the plan and training settings shared by its rows ("defaults"), which of
those settings the source does not state ("assumed"), and the rows with their published numbers.

Metrics and conventions (match the source's FLOP counting):
- tflops_per_gpu / megatron-eq3: Narayanan et al. 2021 Eq. 3 FLOPs (recomputation counted) per iteration
  / (step time x GPUs) (kpi.megatron_gpt_flops_per_iteration);
- tflops_per_gpu / palm-model-flops: PaLM model FLOPs per token (kpi.flops_per_token) x tokens/s / GPUs;
- tokens_per_s_per_gpu / absolute or ratio-within-group: the second compares each row with the first
  row of its group (pred_i / pred_ref vs pub_i / pub_ref), for sources whose device peak is unknown;
- memory_gib: the planner's per-GPU total (GiB = 2^30 B);
- step_s: seconds per iteration;
- layer_ms: forward + backward (+ recomputation) of one layer for one micro-batch, with its
  tensor-parallel communication (Korthikanti et al. 2022 Table 4).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wavefront.shapes import get_model
from wavefront.workbench import kpi
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner.cluster import make_cluster
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.parallel import PlanConfig
from wavefront.workbench.planner.search import PlanResult, evaluate
from wavefront.workbench.planner.time import layer_compute_s, tp_comm_per_layer_s
from wavefront.workbench.planner.training import Efficiency, Training

SCHEMA = "wavefront.published/1"
METRICS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "memory_gib", "step_s", "layer_ms")
CONVENTIONS = ("megatron-eq3", "palm-model-flops", "absolute", "ratio-within-group")

_PLAN_KEYS = ("tp", "sp", "pp", "vpp", "cp", "zero", "recompute", "micro_batch")
_TRAIN_KEYS = ("precision", "optimizer", "grad_bytes", "dp_overlap", "tp_overlap", "bucket_mb",
               "framework_overhead_gb", "allocator_slack", "zero3_16bit_shard")


@dataclass(frozen=True)
class RowComparison:
    table: str
    row: str
    metric: str
    published: float
    predicted: float
    rel_error: float  # predicted / published - 1 (for ratio metrics: of the ratios)
    plan: str
    fits: bool  # whether the planner thinks the published plan fits in memory

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TableReport:
    name: str
    title: str
    use: str  # "calibration" (constants were fitted on it) or "validation" (held out)
    rows: list[RowComparison] = field(default_factory=list)

    def metrics(self) -> list[str]:
        return sorted({r.metric for r in self.rows})

    def median_abs_error(self, metric: str | None = None) -> float:
        errs = [abs(r.rel_error) for r in self.rows if metric is None or r.metric == metric]
        return statistics.median(errs) if errs else float("nan")

    def as_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "use": self.use,
                "median_abs_error": {m: self.median_abs_error(m) for m in self.metrics()},
                "rows": [r.as_dict() for r in self.rows]}


def load_table(path: str | Path) -> dict:
    """Read and check a published-table document; malformed files are a ValueError naming the problem."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"published table {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"published table {path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: expected an object with schema {SCHEMA!r}")
    for key in ("name", "title", "source", "hardware", "metrics", "defaults", "rows"):
        if key not in doc:
            raise ValueError(f"{path}: missing field {key!r}")
    for metric in doc["metrics"]:
        if metric.get("name") not in METRICS or metric.get("convention") not in CONVENTIONS:
            raise ValueError(f"{path}: metric {metric} must name one of {METRICS} with a convention in "
                             f"{CONVENTIONS}")
    if not doc["rows"]:
        raise ValueError(f"{path}: no rows")
    return doc


def _row_settings(doc: dict, row: dict) -> dict:
    merged = dict(doc["defaults"])
    merged.update({k: v for k, v in row.items() if k != "published"})
    return merged


def _row_inputs(doc: dict, row: dict, efficiency: Efficiency | None = None):
    """(model, plan, training, cluster, efficiency) of a published row."""
    st = _row_settings(doc, row)
    hw = doc["hardware"]
    dims = get_model(st["model"])
    model = ModelSpec(dims, attention=st.get("attention", "flash"), dropout=bool(st.get("dropout", False)),
                      kernels=st.get("kernels", "fused"))
    n = int(st["n_gpus"])
    gpu = get_gpu(hw["gpu"])
    cluster = make_cluster((n, gpu), gpus_per_node=int(hw.get("gpus_per_node", 8)),
                           inter_gbps=hw.get("inter_gbps"), intra_gbps=hw.get("intra_gbps"))
    seq = int(st["seq_len"])
    train_kw = {k: st[k] for k in _TRAIN_KEYS if k in st}
    training = Training(global_batch_tokens=int(st["global_batch"]) * seq, seq_len=seq, **train_kw)
    plan_kw = {k: st[k] for k in _PLAN_KEYS if k in st}
    model_parallel = plan_kw.get("tp", 1) * plan_kw.get("pp", 1) * plan_kw.get("cp", 1)
    if n % model_parallel:
        raise ValueError(f"{doc['name']} row {row.get('id')}: tp*pp*cp = {model_parallel} does not divide {n} GPUs")
    cfg = PlanConfig(dp=n // model_parallel, **plan_kw)
    return model, cfg, training, cluster, efficiency or Efficiency.for_gpu(gpu.key)


def predict_row(doc: dict, row: dict, efficiency: Efficiency | None = None) -> PlanResult:
    """The planner's evaluation of the plan a published row ran."""
    model, cfg, training, cluster, eff = _row_inputs(doc, row, efficiency)
    uneven = bool(_row_settings(doc, row).get("uneven_layers", False))
    result = evaluate(model, cfg, training, cluster, eff, allow_uneven_layers=uneven)
    if result.time is None:
        raise ValueError(f"{doc['name']} row {row.get('id')}: the published plan is invalid here: "
                         f"{'; '.join(result.reasons)}")
    return result


def _metric_value(metric: dict, doc: dict, row: dict, result: PlanResult,
                  efficiency: Efficiency | None = None) -> float:
    name, conv = metric["name"], metric["convention"]
    st = _row_settings(doc, row)
    step = result.time.step_s
    n = result.cluster.n_gpus
    if name == "memory_gib":
        return result.memory.total_bytes / 2**30
    if name == "tokens_per_s_per_gpu":
        return result.kpis.tokens_per_s_per_gpu
    if name == "step_s":
        return step
    if name == "layer_ms":
        model, cfg, training, cluster, eff = _row_inputs(doc, row, efficiency)
        layer, _ = layer_compute_s(model, cfg, training, cluster, eff)
        return (layer + tp_comm_per_layer_s(model, cfg, training, cluster)) * 1e3
    if conv == "megatron-eq3":
        d = get_model(st["model"])
        flops = kpi.megatron_gpt_flops_per_iteration(int(st["global_batch"]), int(st["seq_len"]), d.n_layers,
                                                     d.hidden, d.vocab, full_recompute=True)
        return flops / (step * n) / 1e12
    return result.kpis.model_tflops_per_gpu


def validate(doc: dict, efficiency: Efficiency | None = None) -> TableReport:
    """Per-row predicted vs published values for every metric of a table."""
    report = TableReport(doc["name"], doc["title"], doc.get("use", "validation"))
    results = [(row, predict_row(doc, row, efficiency)) for row in doc["rows"]]
    for metric in doc["metrics"]:
        name, conv = metric["name"], metric["convention"]
        have = [(row, res) for row, res in results if row["published"].get(name) is not None]
        refs: dict[str, tuple[float, float]] = {}
        for row, res in have:
            pub = float(row["published"][name])
            pred = _metric_value(metric, doc, row, res, efficiency)
            if conv == "ratio-within-group":
                group = row.get("group", "")
                if group not in refs:
                    refs[group] = (pub, pred)
                    continue
                pub_ref, pred_ref = refs[group]
                pub, pred = pub / pub_ref, pred / pred_ref
            report.rows.append(RowComparison(doc["name"], str(row.get("id")), name, pub, pred, pred / pub - 1.0,
                                             res.config.label(), res.memory.fits))
    return report


def validate_files(paths: list[str | Path], efficiency: Efficiency | None = None) -> list[TableReport]:
    return [validate(load_table(p), efficiency) for p in paths]


def fit_gemm_efficiency(doc: dict, metric_name: str = "tflops_per_gpu", lo: float = 0.3, hi: float = 1.0,
                        rows: list[str] | None = None) -> float:
    """The Efficiency.gemm that minimises the median absolute error of `metric_name` over `rows` (all by
    default): golden-section search, the way the CALIBRATED_GEMM constants were obtained."""
    selected = dict(doc)
    if rows is not None:
        selected["rows"] = [r for r in doc["rows"] if str(r.get("id")) in rows]
    gpu_default = Efficiency.for_gpu(doc["hardware"]["gpu"])

    def loss(g: float) -> float:
        eff = Efficiency(gemm=g, attention=gpu_default.attention, hbm=gpu_default.hbm, source="fit")
        return validate(selected, eff).median_abs_error(metric_name)

    ratio = (5 ** 0.5 - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    for _ in range(40):
        if loss(c) < loss(d):
            b = d
        else:
            a = c
        c, d = b - ratio * (b - a), a + ratio * (b - a)
    return round((a + b) / 2, 3)
