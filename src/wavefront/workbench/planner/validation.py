"""Reproduce published training runs with the cost model: per-row error and the median per table.

A published table is a JSON document (tests/data/published/*.json, schema "wavefront.published/1"):
its source (citation, URL, table, how it was transcribed), the hardware, the metric and the convention
the source used to compute it, the plan and training settings shared by its rows ("defaults"), which of
those settings the source does not state ("assumed"), and the rows with their published numbers.

Metrics and conventions (match the source's FLOP counting):
- tflops_per_gpu / megatron-eq3: Narayanan et al. 2021 Eq. 3 FLOPs (recomputation counted) per iteration
  / (step time x GPUs) (kpi.megatron_gpt_flops_per_iteration);
- tflops_per_gpu / palm-model-flops: PaLM model FLOPs per token (kpi.flops_per_token) x tokens/s / GPUs;
- tflops_per_gpu / nemo-llama: NeMo's model FLOPs per token for Llama-style models, attention counted over
  the whole s x s square (kpi.nemo_llama_flops_per_token) x tokens/s / GPUs;
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
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wavefront.shapes import ModelDims, get_model
from wavefront.workbench import kpi
from wavefront.workbench.document import encode
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner.cluster import Cluster, make_cluster
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.moe import get_moe_model
from wavefront.workbench.planner.parallel import PlanConfig
from wavefront.workbench.planner.recipes import RECIPE_SETS, recipe_for
from wavefront.workbench.planner.search import PlanResult, _k, _m, _t, evaluate
from wavefront.workbench.planner.stacks import DEFAULT_PROFILE, PROFILE_FIELDS, PROFILES, StackProfile, get_profile
from wavefront.workbench.planner.time import layer_compute_s, tp_comm_per_layer_s
from wavefront.workbench.planner.training import FAMILY_OF, PHYSICS_FAMILY, PHYSICS_SHARED, Efficiency, Training

SCHEMA = "wavefront.published/1"
VALIDATION_SCHEMA = "wavefront.plan.validation/1"
METRICS = ("tflops_per_gpu", "tokens_per_s_per_gpu", "memory_gib", "step_s", "layer_ms")
CONVENTIONS = ("megatron-eq3", "palm-model-flops", "nemo-llama", "absolute", "ratio-within-group")

_PLAN_KEYS = ("tp", "sp", "pp", "vpp", "cp", "zero", "recompute", "micro_batch", "ep")
_TRAIN_KEYS = ("precision", "optimizer", "grad_bytes", "dp_overlap", "tp_overlap", "bucket_mib", "loss_logits",
               "framework_overhead_gb", "allocator_slack", "zero3_16bit_shard", "zero3_unit", "stack", "cp_comm",
               "moe_imbalance", "moe_capacity_factor", "ep_overlap", "attention_kernel", "pp_round",
               "ep_dispatch", "recompute_modules", "offload_activation_layers")

#: efficiency_for(gpu_key, profile): the constants to price a row with (None: the profile's own).
EfficiencyFor = Callable[[str, StackProfile], Efficiency | None]


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
    profile: str = ""  # the stack profile the row was priced with (stacks.py)


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

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "use": self.use,
                "median_abs_error": {m: self.median_abs_error(m) for m in self.metrics()},
                "rows": encode(self.rows)}


def load_table(path: str | Path) -> dict[str, Any]:
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


def _row_settings(doc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    merged = dict(doc["defaults"])
    merged.update({k: v for k, v in row.items() if k != "published"})
    return merged


def split_of(table: str, row_id: str) -> str:
    """The deterministic calibration / held-out split of a row, fixed before any constant was fitted:
    calibration when the first 8 hex digits of sha256("<table>/<row id>") are 0-2 mod 10 (30%)."""
    digest = int(hashlib.sha256(f"{table}/{row_id}".encode()).hexdigest()[:8], 16)
    return "calibration" if digest % 10 < 3 else "held-out"


def row_dims(doc: dict[str, Any], name: str) -> ModelDims:
    """A model named by a row: the table's own "models" (with their sources) first, then the presets."""
    spec = doc.get("models", {}).get(name)
    if spec is None:
        moe = get_moe_model(name)
        return moe.dims if moe is not None else get_model(name)
    return ModelDims(name=name, **spec)


def row_profile(doc: dict[str, Any], row: dict[str, Any], stated: bool = True) -> StackProfile:
    """The stack profile a row ran on (its table's "profile", or the row's own), or with stated=False the
    default profile: what a user who gives no --stack gets."""
    return get_profile(_row_settings(doc, row).get("profile", DEFAULT_PROFILE) if stated else DEFAULT_PROFILE)


def recipe_facts(doc: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The settings a row's recipe states beyond its table (recipes.py), when the table names a recipe set
    (defaults "recipes") and a config's plan equals the row's: its dispatcher and EP overlap, and its
    recompute modules; a setting the row states itself wins over them, they win over the table's defaults."""
    st = _row_settings(doc, row)
    recipes = RECIPE_SETS.get(st.get("recipes", ""))
    if recipes is None:
        return {}
    recipe = recipe_for(st | {"gpu": st.get("gpu", doc["hardware"]["gpu"])}, recipes)
    return recipe.facts() if recipe is not None else {}


def _row_inputs(doc: dict[str, Any], row: dict[str, Any], efficiency: Efficiency | None = None,
                stated: bool = True) -> tuple[ModelSpec, PlanConfig, Training, Cluster, Efficiency]:
    """(model, plan, training, cluster, efficiency) of a published row, priced with its stack profile
    (stated) or with the default profile (stated=False: the table's stack fields are dropped too)."""
    facts = recipe_facts(doc, row)
    plan_facts = {k: v for k, v in facts.items() if k in ("recompute", "recompute_modules") and "recompute" not in row}
    st = _row_settings(doc, row) | plan_facts  # the recipe's checkpointing is the plan's: kept with stated=False
    prof = row_profile(doc, row, stated)
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
                           inter_gbps=hw.get("inter_gbps"), intra_gbps=hw.get("intra_gbps"),
                           hierarchical=prof.hierarchical)
    seq = int(st["seq_len"])
    stack_facts = {k: v for k, v in facts.items() if k in ("ep_dispatch", "ep_overlap")} if stated else {}
    train_kw = prof.training_fields() | stack_facts | {
        k: st[k] for k in _TRAIN_KEYS if k in st and (stated or k not in PROFILE_FIELDS)}
    if "recompute_modules" in train_kw:
        train_kw["recompute_modules"] = tuple(train_kw["recompute_modules"])
    training = Training(global_batch_tokens=int(st["global_batch"]) * seq, seq_len=seq, **train_kw)
    plan_kw = {k: st[k] for k in _PLAN_KEYS if k in st}
    model_parallel = plan_kw.get("tp", 1) * plan_kw.get("pp", 1) * plan_kw.get("cp", 1)
    if n % model_parallel:
        raise ValueError(f"{doc['name']} row {row.get('id')}: tp*pp*cp = {model_parallel} does not divide {n} GPUs")
    cfg = PlanConfig(dp=n // model_parallel, **plan_kw)
    return model, cfg, training, cluster, efficiency or prof.efficiency(gpu.key)


def predict_row(doc: dict[str, Any], row: dict[str, Any], efficiency: Efficiency | None = None,
                stated: bool = True) -> PlanResult:
    """The planner's evaluation of the plan a published row ran."""
    model, cfg, training, cluster, eff = _row_inputs(doc, row, efficiency, stated)
    uneven = bool(_row_settings(doc, row).get("uneven_layers", False))
    result = evaluate(model, cfg, training, cluster, eff, allow_uneven_layers=uneven)
    if result.time is None:
        raise ValueError(f"{doc['name']} row {row.get('id')}: the published plan is invalid here: "
                         f"{'; '.join(result.reasons)}")
    return result


def _metric_value(metric: dict[str, Any], doc: dict[str, Any], row: dict[str, Any], result: PlanResult,
                  efficiency: Efficiency | None = None, stated: bool = True) -> float:
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
        model, cfg, training, cluster, eff = _row_inputs(doc, row, efficiency, stated)
        layer, _ = layer_compute_s(model, cfg, training, cluster, eff)
        return (layer + tp_comm_per_layer_s(model, cfg, training, cluster)) * 1e3
    if conv == "megatron-eq3":
        d = row_dims(doc, st["model"])
        flops = kpi.megatron_gpt_flops_per_iteration(int(st["global_batch"]), int(st["seq_len"]), d.n_layers,
                                                     d.hidden, d.vocab, full_recompute=True)
        return flops / (step * n) / 1e12
    if conv == "nemo-llama":
        per_token = kpi.nemo_llama_flops_per_token(row_dims(doc, st["model"]), int(st["seq_len"]))
        return per_token * _k(result).tokens_per_s_per_gpu / 1e12
    return _k(result).model_tflops_per_gpu


def validate(doc: dict[str, Any], efficiency: Efficiency | None = None, efficiency_for: EfficiencyFor | None = None,
             stated: bool = True,
             rows: Callable[[dict[str, Any]], bool] | None = None) -> TableReport:
    """Per-row predicted vs published values for every metric of a table, each row priced with its stack
    profile (stated) or the default profile (stated=False).

    efficiency_for(gpu_key, profile) -> Efficiency | None, when given, picks the constants per row (None:
    the profile's own); rows(row) -> bool keeps only some rows."""
    report = TableReport(doc["name"], doc["title"], doc.get("use", "validation"))
    def gpu_of(row: dict[str, Any]) -> str:
        return str(_row_settings(doc, row).get("gpu", doc["hardware"]["gpu"]))

    def eff_of(row: dict[str, Any]) -> Efficiency | None:
        if efficiency_for is None:
            return efficiency
        return efficiency_for(get_gpu(gpu_of(row)).key, row_profile(doc, row, stated))

    results = [(row, predict_row(doc, row, eff_of(row), stated)) for row in doc["rows"] if rows is None or rows(row)]
    for metric in doc["metrics"]:
        name, conv = metric["name"], metric["convention"]
        have = [(row, res) for row, res in results if row["published"].get(name) is not None]
        refs: dict[str, tuple[float, float]] = {}
        for row, res in have:
            pub = float(row["published"][name])
            pred = _metric_value(metric, doc, row, res, efficiency, stated)
            if conv == "ratio-within-group":
                group = row.get("group", "")
                if group not in refs:
                    refs[group] = (pub, pred)
                    continue
                pub_ref, pred_ref = refs[group]
                pub, pred = pub / pub_ref, pred / pred_ref
            report.rows.append(RowComparison(doc["name"], str(row.get("id")), name, pub, pred, pred / pub - 1.0,
                                             res.config.label(), _m(res).fits_device, row.get("split", ""),
                                             row_profile(doc, row, stated).key))
    return report


def validate_files(paths: Sequence[str | Path], efficiency: Efficiency | None = None) -> list[TableReport]:
    return [validate(load_table(p), efficiency) for p in paths]


#: The throughput tables of the accuracy report (docs/planner.md): every row carries its split.
REPORT_TABLES = ("validation/llmfoundry_mpt.json", "validation/nemo_2407_h100_fp8.json",
                 "validation/megatron_bridge_2511.json", "narayanan2021_table1.json", "narayanan2021_table2.json",
                 "llama3_2024_table4.json", "validation/nemo_2502_fp8.json", "validation/megatron_bridge_2509.json",
                 "validation/megatron_bridge_2602.json", "validation/torchtitan_a100_2024.json",
                 "validation/nemo_2403_long_sequence.json", "validation/nemo_2504_long_sequence_b200.json",
                 "validation/megatron_bridge_2602_2606.json", "validation/megatron_bridge_gb200.json",
                 "validation/nemo_2504_2507_gb200.json", "validation/dgxc_nemo_2409_h100.json")
THROUGHPUT_METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu")
#: The mixture-of-experts throughput tables (docs/planner.md, "MoE accuracy"): split by the same hash rule
#: when transcribed; no constant is fitted on them (the MoE terms reuse the dense fit).
MOE_REPORT_TABLES = ("validation/megatron_bridge_2509_moe.json", "validation/megatron_bridge_2511_moe.json",
                     "validation/automodel_moe.json", "validation/megatron_bridge_2602_2606_moe.json",
                     "validation/megatron_bridge_2602_moe.json", "validation/megatron_bridge_gb200_moe.json")


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


def source_of(doc: dict[str, Any]) -> str:
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


def report_tables(root: str | Path, efficiency_for: EfficiencyFor | None = None,
                  tables: tuple[str, ...] = REPORT_TABLES, stated: bool = True) -> list[tuple[str, TableReport]]:
    """Validate every `tables` file (REPORT_TABLES, or MOE_REPORT_TABLES) under `root`
    (tests/data/published) -> (source, report) pairs; stated=False prices every row with the default
    profile (what `wavefront plan` gives without --stack).

    efficiency_for(gpu_key, profile) -> Efficiency | None overrides a profile's constants (the fit uses it)."""
    out = []
    for rel in tables:
        doc = load_table(Path(root) / rel)
        out.append((source_of(doc), validate(doc, efficiency_for=efficiency_for, stated=stated)))
    return out


#: A GPU family's constants are fitted only from this many calibration rows of the stack on that family
#: (one scale needs one row); without them the family keeps the physics defaults (stacks.py).
MIN_FIT_ROWS = 1
#: With this many rows, gemm and attention (and, with as many fp8 and bf16 rows, fp8_gemm; kernel_us) are
#: fitted separately; between MIN_FIT_ROWS and this, one scale on both physics defaults.
MIN_SEPARATE_ROWS = 10
_BOUNDS = {"gemm": (0.3, 0.99), "attention": (0.1, 0.95), "scale": (0.3, 1.15), "kernel_us": (0.0, 40.0),
           "fp8_gemm": (0.4, 1.0), "moe_layer_us": (0.0, 5000.0)}


def _profile_rows(root: str | Path, profile: StackProfile,
                  moe: bool = False) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(doc, row) of every calibration row priced with `profile` in its own dense (or MoE) tables."""
    out = []
    for rel in MOE_REPORT_TABLES if moe else REPORT_TABLES:
        doc = load_table(Path(root) / rel)
        if doc["name"] not in profile.tables:
            continue
        out += [(doc, row) for row in doc["rows"] if row.get("split") == "calibration"
                and row_profile(doc, row).key == profile.key
                and any(row["published"].get(m) is not None for m in THROUGHPUT_METRICS)]
    return out


def fit_params(root: str | Path, profile: StackProfile) -> dict[str, float]:
    """The constants a profile's own calibration rows can fix (stacks.py docstring), at their physics
    starting values: "<family>.gemm", "<family>.attention" or "<family>.scale", "fp8_gemm", "kernel_us"."""
    rows = _profile_rows(root, profile)
    by_family: dict[str, list[dict[str, Any]]] = {}
    for doc, row in rows:
        gpu = get_gpu(_row_settings(doc, row).get("gpu", doc["hardware"]["gpu"])).key
        if gpu in FAMILY_OF:
            by_family.setdefault(FAMILY_OF[gpu][0], []).append(_row_settings(doc, row))
    params: dict[str, float] = {}
    for family, sts in sorted(by_family.items()):
        if len(sts) >= MIN_SEPARATE_ROWS:
            params |= {f"{family}.{k}": v for k, v in PHYSICS_FAMILY[family].items()}
        elif len(sts) >= MIN_FIT_ROWS:
            params[f"{family}.scale"] = 1.0
    every = [st for sts in by_family.values() for st in sts]
    n_fp8 = sum(st.get("precision", "bf16") == "fp8" for st in every)
    if n_fp8 >= MIN_SEPARATE_ROWS and len(every) - n_fp8 >= MIN_SEPARATE_ROWS:
        params["fp8_gemm"] = PHYSICS_SHARED["fp8_gemm"]
    if len(every) >= MIN_SEPARATE_ROWS:
        params["kernel_us"] = PHYSICS_SHARED["kernel_us"]
    return params


def fitted_constants(params: dict[str, float]) -> dict[str, Any]:
    """A fit's parameters as StackProfile.fitted: absolute gemm / attention per family, shared ones."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        family, _, k = name.rpartition(".")
        if k == "scale":
            out[family] = {c: round(min(0.99, v * value), 3) for c, v in PHYSICS_FAMILY[family].items()}
        elif family:
            out.setdefault(family, {})[k] = value
        else:
            out.setdefault("shared", {})[k] = value
    return out


def _profile_with(profile: StackProfile, params: dict[str, float]) -> StackProfile:
    return replace(profile, fitted=fitted_constants(params))


def priced_with(trial: StackProfile) -> EfficiencyFor:
    """An efficiency_for that prices the rows of trial's profile (same key) with trial's constants and every
    other row with its own profile's."""
    def efficiency_for(gpu: str, prof: StackProfile) -> Efficiency | None:
        return trial.efficiency(gpu) if prof.key == trial.key else None
    return efficiency_for


def profile_loss(root: str | Path, profile: StackProfile, params: dict[str, float], moe: bool = False) -> float:
    """Mean |log(predicted / published)| of the profile's own calibration rows' throughput: its dense
    tables with `params` as its constants, or (moe) its MoE tables with `params` added to its constants."""
    trial = _profile_with(profile, params) if not moe else replace(profile, fitted=profile.fitted | {
        "shared": profile.fitted.get("shared", {}) | params})
    errs = []
    efficiency_for = priced_with(trial)
    for rel in MOE_REPORT_TABLES if moe else REPORT_TABLES:
        doc = load_table(Path(root) / rel)
        if doc["name"] not in profile.tables:
            continue

        def own_calibration(row: dict[str, Any], doc: dict[str, Any] = doc) -> bool:
            return row.get("split") == "calibration" and row_profile(doc, row).key == profile.key

        rep = validate(doc, efficiency_for=efficiency_for, rows=own_calibration)
        errs += [abs(math.log1p(r.rel_error)) for r in rep.rows if r.metric in THROUGHPUT_METRICS]
    return sum(errs) / len(errs) if errs else 0.0


def calibration_row_names(root: str | Path, profile: StackProfile) -> tuple[str, ...]:
    """"table/row id" of every row fit_profile and fit_profile_moe fit `profile` on."""
    return tuple(f"{doc['name']}/{row['id']}" for moe in (False, True)
                 for doc, row in _profile_rows(root, profile, moe))


def fit_profile(root: str | Path, profile: StackProfile, sweeps: int = 3) -> dict[str, Any]:
    """Coordinate descent (golden section per constant) on profile_loss over the profile's own calibration
    rows only (no other stack's rows, no held-out row). Returns StackProfile.fitted, rounded to 3 digits."""
    return fitted_constants(_descend(root, profile, fit_params(root, profile), False, sweeps))


def fit_profile_moe(root: str | Path, profile: StackProfile) -> dict[str, Any]:
    """The MoE term a profile's own MoE calibration rows fix, on top of its dense constants: moe_layer_us
    (Efficiency.moe_layer_us), one constant, fitted only where the profile has MoE calibration rows."""
    if not _profile_rows(root, profile, moe=True):
        return {}
    return _descend(root, profile, {"moe_layer_us": PHYSICS_SHARED["moe_layer_us"]}, True, 1)


def _descend(root: str | Path, profile: StackProfile, params: dict[str, float], moe: bool,
             sweeps: int) -> dict[str, Any]:
    params = dict(params)
    ratio = (5 ** 0.5 - 1) / 2
    for _ in range(sweeps if params else 0):
        for name in params:
            lo, hi = _BOUNDS[name.split(".")[-1]]

            def loss(v: float, name: str = name) -> float:
                return profile_loss(root, profile, params | {name: v}, moe)

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


def fit_all(root: str | Path) -> dict[str, dict[str, Any]]:
    """Every profile's fit: key -> {"fitted": ..., "calibration_rows": ...} (what stacks.PROFILES holds):
    the dense constants on its dense calibration rows, then its MoE term on its MoE calibration rows."""
    out = {}
    for key, p in PROFILES.items():
        dense = fit_profile(root, p)
        moe = fit_profile_moe(root, replace(p, fitted=dense))
        fitted = dense | ({"shared": dense.get("shared", {}) | moe} if moe else {})
        out[key] = {"fitted": fitted, "calibration_rows": calibration_row_names(root, p)}
    return out

