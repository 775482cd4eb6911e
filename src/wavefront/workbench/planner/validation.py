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

import hashlib
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from wavefront.shapes import ModelDims, get_model
from wavefront.workbench import kpi
from wavefront.workbench.document import encode
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner.cluster import make_cluster
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.moe import get_moe_model
from wavefront.workbench.planner.parallel import PlanConfig
from wavefront.workbench.planner.search import PlanResult, _k, _m, _t, evaluate
from wavefront.workbench.planner.time import layer_compute_s, tp_comm_per_layer_s
from wavefront.workbench.planner.training import Efficiency, Training

SCHEMA = "wavefront.published/1"
VALIDATION_SCHEMA = "wavefront.plan.validation/1"
METRICS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "memory_gib", "step_s", "layer_ms")
CONVENTIONS = ("megatron-eq3", "palm-model-flops", "absolute", "ratio-within-group")

_PLAN_KEYS = ("tp", "sp", "pp", "vpp", "cp", "zero", "recompute", "micro_batch", "ep")
_TRAIN_KEYS = ("precision", "optimizer", "grad_bytes", "dp_overlap", "tp_overlap", "bucket_mib", "loss_logits",
               "framework_overhead_gb", "allocator_slack", "zero3_16bit_shard", "stack", "cp_comm",
               "moe_imbalance", "ep_overlap", "attention_kernel")


@dataclass(frozen=True)
class RowComparison:
    table: str
    row: str
    metric: str
    published: float
    predicted: float
    rel_error: float  # predicted / published - 1 (for ratio metrics: of the ratios)
    plan: str
    fits: bool  # whether the planner thinks the published plan fits in the device's memory (it ran)
    split: str = ""  # "calibration" or "held-out" (tables with a split); "" otherwise


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
                "rows": encode(self.rows)}


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


def split_of(table: str, row_id: str) -> str:
    """The deterministic calibration / held-out split of a row, fixed before any constant was fitted:
    calibration when the first 8 hex digits of sha256("<table>/<row id>") are 0-2 mod 10 (30%)."""
    digest = int(hashlib.sha256(f"{table}/{row_id}".encode()).hexdigest()[:8], 16)
    return "calibration" if digest % 10 < 3 else "held-out"


def row_dims(doc: dict, name: str) -> ModelDims:
    """A model named by a row: the table's own "models" (with their sources) first, then the presets."""
    spec = doc.get("models", {}).get(name)
    if spec is None:
        moe = get_moe_model(name)
        return moe.dims if moe is not None else get_model(name)
    return ModelDims(name=name, **spec)


def _row_inputs(doc: dict, row: dict, efficiency: Efficiency | None = None):
    """(model, plan, training, cluster, efficiency) of a published row."""
    st = _row_settings(doc, row)
    hw = dict(doc["hardware"])
    if "gpu" in st:
        hw["gpu"] = st["gpu"]
    dims = row_dims(doc, st["model"])
    moe = get_moe_model(st["model"]) if st["model"] not in doc.get("models", {}) else None
    model = ModelSpec(dims, attention=st.get("attention", "flash"), dropout=bool(st.get("dropout", False)),
                      kernels=st.get("kernels", "fused"), moe=moe.moe if moe else None, mla=moe.mla if moe else None)
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
    step = _t(result).step_s
    n = result.cluster.n_gpus
    if name == "memory_gib":
        return _m(result).total_bytes / 2**30
    if name == "tokens_per_s_per_gpu":
        return _k(result).tokens_per_s_per_gpu
    if name == "step_s":
        return step
    if name == "layer_ms":
        model, cfg, training, cluster, eff = _row_inputs(doc, row, efficiency)
        layer, _ = layer_compute_s(model, cfg, training, cluster, eff)
        return (layer + tp_comm_per_layer_s(model, cfg, training, cluster)) * 1e3
    if conv == "megatron-eq3":
        d = row_dims(doc, st["model"])
        flops = kpi.megatron_gpt_flops_per_iteration(int(st["global_batch"]), int(st["seq_len"]), d.n_layers,
                                                     d.hidden, d.vocab, full_recompute=True)
        return flops / (step * n) / 1e12
    return _k(result).model_tflops_per_gpu


def validate(doc: dict, efficiency: Efficiency | None = None, efficiency_for=None) -> TableReport:
    """Per-row predicted vs published values for every metric of a table.

    efficiency_for(gpu_key) -> Efficiency, when given, picks the constants per row's GPU."""
    report = TableReport(doc["name"], doc["title"], doc.get("use", "validation"))
    gpu_of = (lambda row: _row_settings(doc, row).get("gpu", doc["hardware"]["gpu"]))
    results = [(row, predict_row(doc, row, efficiency_for(get_gpu(gpu_of(row)).key) if efficiency_for else efficiency))
               for row in doc["rows"]]
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
                                             res.config.label(), _m(res).fits_device, row.get("split", "")))
    return report


def validate_files(paths: list[str | Path], efficiency: Efficiency | None = None) -> list[TableReport]:
    return [validate(load_table(p), efficiency) for p in paths]


#: The throughput tables of the accuracy report (docs/planner.md): every row carries its split.
REPORT_TABLES = ("validation/llmfoundry_mpt.json", "validation/nemo_2407_h100_fp8.json",
                 "validation/megatron_bridge_2511.json", "narayanan2021_table1.json", "narayanan2021_table2.json",
                 "llama3_2024_table4.json", "validation/nemo_2502_fp8.json", "validation/megatron_bridge_2509.json",
                 "validation/megatron_bridge_2602.json")
THROUGHPUT_METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu")
#: The mixture-of-experts throughput tables (docs/planner.md, "MoE accuracy"): split by the same hash rule
#: when transcribed; no constant is fitted on them (the MoE terms reuse the dense fit).
MOE_REPORT_TABLES = ("validation/megatron_bridge_2509_moe.json", "validation/megatron_bridge_2511_moe.json",
                     "validation/automodel_moe.json")


@dataclass(frozen=True)
class SplitSummary:
    """Throughput error statistics of one source (or "overall") on one split. The relative error of
    TFLOP/s per GPU equals that of tokens/s per GPU (fixed FLOPs per token), so both count."""

    source: str
    split: str
    n_runs: int
    median_abs_error: float
    p90_abs_error: float
    signed_median_error: float


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def source_of(doc: dict) -> str:
    return str(doc.get("source_group", doc["name"]))


def split_summaries(reports: list[tuple[str, TableReport]], split: str = "held-out") -> list[SplitSummary]:
    """Per source and overall: runs, median and p90 of |error|, signed median, for one split."""
    by_source: dict[str, list[float]] = {}
    for source, rep in reports:
        errs = [r.rel_error for r in rep.rows if r.metric in THROUGHPUT_METRICS and r.split == split]
        if errs:
            by_source.setdefault(source, []).extend(errs)
    out = []
    every: list[float] = []
    for source, errs in sorted(by_source.items()):
        every.extend(errs)
        out.append(SplitSummary(source, split, len(errs), statistics.median(abs(e) for e in errs),
                                _quantile([abs(e) for e in errs], 0.9), statistics.median(errs)))
    if every:
        out.append(SplitSummary("overall", split, len(every), statistics.median(abs(e) for e in every),
                                _quantile([abs(e) for e in every], 0.9), statistics.median(every)))
    return out


def report_tables(root: str | Path, efficiency_for=None,
                  tables: tuple[str, ...] = REPORT_TABLES) -> list[tuple[str, TableReport]]:
    """Validate every `tables` file (REPORT_TABLES, or MOE_REPORT_TABLES) under `root`
    (tests/data/published) -> (source, report) pairs.

    efficiency_for(gpu_key) -> Efficiency overrides the calibrated constants (the fit uses it)."""
    out = []
    for rel in tables:
        doc = load_table(Path(root) / rel)
        out.append((source_of(doc), validate(doc, efficiency_for=efficiency_for)))
    return out


#: The constants fit_constants fits: per GPU family (matmul and attention efficiency) and shared ones.
FAMILIES = {"a100": ("a100", "a100-40gb"), "h100": ("h100", "h200", "b200")}
SHARED = ("kernel_us", "fp8_gemm")
_BOUNDS = {"gemm": (0.3, 0.95), "attention": (0.1, 0.9), "kernel_us": (0.0, 40.0), "fp8_gemm": (0.4, 1.0),
           "fsdp_stack": (0.4, 1.0)}


def _efficiency_from(params: dict) -> Callable[[str], Efficiency]:
    def efficiency_for(gpu_key: str) -> Efficiency:
        family = next((f for f, keys in FAMILIES.items() if gpu_key in keys), None)
        if family is None:
            return Efficiency.for_gpu(gpu_key)
        return Efficiency(gemm=params[f"{family}.gemm"], attention=params[f"{family}.attention"],
                          kernel_us=params["kernel_us"], fp8_gemm=params["fp8_gemm"],
                          fsdp_stack=params[f"{family}.fsdp_stack"], source="fit")
    return efficiency_for


def calibration_loss(root: str | Path, params: dict) -> float:
    """Mean |log(predicted / published)| of the calibration rows' throughput (robust, scale-free)."""
    import math

    errs = [abs(math.log1p(r.rel_error)) for _, rep in report_tables(root, _efficiency_from(params))
            for r in rep.rows if r.split == "calibration" and r.metric in THROUGHPUT_METRICS]
    return sum(errs) / len(errs)


def fit_constants(root: str | Path, start: dict, sweeps: int = 3) -> dict:
    """Coordinate descent (golden section per constant) on calibration_loss over the calibration rows
    only; the held-out rows never enter. Returns the fitted constants, rounded to 3 digits."""
    params = dict(start)
    ratio = (5 ** 0.5 - 1) / 2
    for _ in range(sweeps):
        for name in params:
            lo, hi = _BOUNDS[name.split(".")[-1]]

            def loss(v: float, name: str = name) -> float:
                return calibration_loss(root, params | {name: v})

            a, b = lo, hi
            c, d = b - ratio * (b - a), a + ratio * (b - a)
            fc, fd = loss(c), loss(d)
            for _ in range(18):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - ratio * (b - a)
                    fc = loss(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + ratio * (b - a)
                    fd = loss(d)
            params[name] = round((a + b) / 2, 3)
    return params
