"""Enumerate every parallel plan for a model on a cluster, evaluate it, rank the feasible ones.

The grid: tensor parallel (with and without sequence parallel) x context parallel x pipeline parallel
over the divisors of the GPU count, data parallel filling the rest; interleaved schedules with 2 and 4
virtual stages; ZeRO 0-3; recomputation none / selective / full; the micro-batch sizes of Training.
Plans that cannot run (a degree not dividing heads, layers or the batch) are counted by reason; plans that
run out of memory (over Training.memory_headroom of the device) are kept as infeasible with their memory
breakdown. Feasible plans are ranked strictly by step time ("time") or by dollars per step ("cost", which
also compares clusters) to RANK_FIGURES significant figures, equal values going to less memory (TIE_RULE).
"""

from __future__ import annotations

import math
import time as _time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, ClassVar

from wavefront.shapes import ModelDims, get_model
from wavefront.workbench import kpi
from wavefront.workbench.document import encode
from wavefront.workbench.planner.cluster import Cluster, make_cluster
from wavefront.workbench.planner.job import DEFAULT_BATCH_TOKENS, SCHEMA, TRAINING_FIX, PlanRequest
from wavefront.workbench.planner.memory import MemoryBreakdown, device_capacity, memory_breakdown
from wavefront.workbench.planner.model import RECOMPUTE_MODES, ModelSpec
from wavefront.workbench.planner.moe import get_moe_model
from wavefront.workbench.planner.parallel import PlanConfig, structural_problems
from wavefront.workbench.planner.stacks import StackProfile
from wavefront.workbench.planner.time import TimeBreakdown, step_time
from wavefront.workbench.planner.training import Efficiency, Training

RANK_BY = ("time", "cost")
#: Plans within this fraction of the winner's step time are named in the explanation as near ties: the
#: model's held-out error (docs/planner.md, ~5%) is larger, so a 1% difference is no strong preference.
NEAR_TIE = 0.01


@dataclass(frozen=True)
class Kpis:
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # model FLOPs (PaLM convention; MoE: active parameters only) / bf16 dense peak
    hfu: float  # adds recomputation FLOPs
    model_tflops_per_gpu: float
    dollars_per_step: float | None
    dollars_per_million_tokens: float | None
    energy_per_step_j: float  # modeled: board power x Cluster.power_fraction
    tokens_per_joule: float
    time_to_train_days: float
    dollars_to_train: float | None


@dataclass(frozen=True)
class PlanResult:
    config: PlanConfig
    cluster: Cluster
    memory: MemoryBreakdown | None
    time: TimeBreakdown | None
    model: ModelSpec | None = None
    training: Training | None = None
    reasons: tuple[str, ...] = ()  # why the plan is infeasible; empty when feasible

    @property
    def feasible(self) -> bool:
        return not self.reasons

    @cached_property
    def kpis(self) -> Kpis | None:
        """Computed on first use: the search ranks thousands of plans and shows a few."""
        if self.time is None or self.model is None or self.training is None:
            return None
        return kpis_for(self.model, self.config, self.training, self.cluster, self.time)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster.label, "config": self.config.as_dict(), "feasible": self.feasible,
            "reasons": list(self.reasons),
            "memory": self.memory.as_dict() if self.memory else None,
            "time": encode(self.time),
            "kpis": encode(self.kpis),
        }


@dataclass
class SearchResult:
    model: ModelSpec
    clusters: list[Cluster]
    training: Training
    efficiency: Efficiency
    rank_by: str
    ranked: list[PlanResult]  # feasible, best first
    out_of_memory: list[PlanResult]  # valid but over capacity, smallest overshoot first
    rejected: Counter[str] = field(default_factory=Counter)  # structural reason -> count
    n_enumerated: int = 0
    elapsed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)  # tiny batches per GPU and the like
    pinned_misses: list[str] = field(default_factory=list)  # why no grid plan matches the pinned fields
    top: int = 10  # plans the document lists (0: all feasible)
    # where each constant came from (PlanRequest.constants_from)
    constants_from: dict[str, Any] = field(default_factory=dict)
    defaulted: list[str] = field(default_factory=list)  # software-stack fields left at their defaults
    profile: StackProfile | None = None  # the software-stack profile the plans are priced with (stacks.py)

    @property
    def best(self) -> PlanResult | None:
        return self.ranked[0] if self.ranked else None

    @property
    def n_evaluated(self) -> int:
        return len(self.ranked) + len(self.out_of_memory)

    def explain(self, n_runner_ups: int = 4) -> list[str]:
        return explain(self, n_runner_ups)

    def header(self) -> list[str]:
        """The lines above the plan table: model and batch, the stack (and whether it was defaulted), and
        the order the rows follow with the memory headroom."""
        spec, tr = self.model, self.training
        moe = spec.moe
        active = (f" ({spec.active_params / 1e9:.1f}B active: {moe.n_experts} experts, top-{moe.top_k}"
                  f"{f', {moe.n_shared} shared' if moe.n_shared else ''}; MFU counts active parameters)" if moe else "")
        lines = [f"[bold]{spec.name}[/]: {spec.total_params / 1e9:.1f}B params{active}; batch "
                 f"{tr.global_batch_tokens:,} tokens ({tr.global_batch_seqs} x {tr.seq_len}), {tr.precision}, "
                 + (f"stack {self.profile.key}" if self.profile else f"no stack profile ({tr.stack} kernels)")
                 + f", {tr.attention_kernel} attention"]
        if "stack" in self.defaulted:
            lines.append(f"stack profile defaulted to {self.profile.key if self.profile else tr.stack} "
                         "(`wavefront train`'s own): other stacks price differently; name yours with --stack "
                         "(--explain shows its terms)")
        if self.ranked:
            by = "step time" if self.rank_by == "time" else "$/step, then step time"
            usable = ", ".join(f"{device_capacity(c.gpu)[0] * tr.memory_headroom / 1e9:.1f} of "
                               f"{device_capacity(c.gpu)[0] / 1e9:.1f} GB" for c in self.clusters)
            lines.append(f"{len(self.ranked):,} feasible plans, best {len(self.shown())} by {by} ({TIE_RULE}); "
                         f"memory headroom {tr.memory_headroom:.2f} ({usable} usable)")
        return lines

    def _efficiency_of(self, c: Cluster) -> Efficiency:
        """The constants `c` was priced with: its profile's (or its GPU's physics defaults), or the
        request's overrides."""
        own = self.profile.efficiency(c.gpu.key) if self.profile else Efficiency.for_gpu(c.gpu.key)
        first = self.profile.efficiency(self.clusters[0].gpu.key) if self.profile else None
        return own if first is None or self.efficiency.source == first.source else self.efficiency

    def shown(self) -> list[PlanResult]:
        return self.ranked if self.top == 0 else self.ranked[:self.top]

    SCHEMA: ClassVar[str] = SCHEMA

    def as_dict(self) -> dict[str, Any]:
        """The `wavefront plan --json` document, schema SCHEMA (docs/json/plan.md)."""
        spec = self.model
        return {
            "schema": SCHEMA,
            "model": encode(spec.dims) | {"params": spec.total_params, "active_params": spec.active_params,
                                            "attention": spec.attention, "dropout": spec.dropout,
                                            "kernels": spec.kernels,
                                            "moe": encode(spec.moe),
                                            "mla": encode(spec.mla)},
            "clusters": [c.as_dict() for c in self.clusters], "training": self.training.as_dict(),
            "efficiency": [encode(self._efficiency_of(c)) for c in self.clusters],
            "constants_from": self.constants_from, "stack_defaulted": list(self.defaulted),
            "stack_profile": ({"name": self.profile.name, "version": self.profile.version, "key": self.profile.key,
                               "calibration_rows": len(self.profile.calibration_rows)} if self.profile else None),
            "rank_by": self.rank_by, "rank_figures": RANK_FIGURES, "tie_rule": TIE_RULE,
            "search": {"n_enumerated": self.n_enumerated, "n_feasible": len(self.ranked),
                       "n_out_of_memory": len(self.out_of_memory), "n_invalid": sum(self.rejected.values()),
                       "invalid_reasons": dict(self.rejected.most_common()), "elapsed_s": self.elapsed_s},
            "warnings": list(self.warnings),
            "plans": [r.as_dict() for r in self.shown()],
            "closest_out_of_memory": [r.as_dict() for r in self.out_of_memory[:5]],
            "explanation": self.explain(),
        }


def _t(r: PlanResult) -> TimeBreakdown:
    assert r.time is not None, "an evaluated plan has a time breakdown"
    return r.time


def _m(r: PlanResult) -> MemoryBreakdown:
    assert r.memory is not None, "an evaluated plan has a memory breakdown"
    return r.memory


def _k(r: PlanResult) -> Kpis:
    kpis = r.kpis
    assert kpis is not None, "an evaluated plan has KPIs"
    return kpis


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _vpp_choices(pp: int, n_layers: int) -> list[int]:
    """1, and with pipeline parallelism every interleaving degree that divides the layers per stage."""
    if pp == 1 or n_layers % pp:
        return [1]
    return _divisors(n_layers // pp)


def _ep_choices(n_experts: int, ranks: int) -> list[int]:
    """Expert-parallel degrees: divisors of the experts that divide tp*cp*dp (1 for dense models)."""
    return [e for e in _divisors(n_experts) if ranks % e == 0] if n_experts > 1 else [1]


def enumerate_configs(n_gpus: int, training: Training, n_layers: int, *, gpus_per_node: int = 8,
                      fixed: dict[str, Any] | None = None, n_experts: int = 0) -> Iterator[PlanConfig]:
    """Every point of the plan grid for n_gpus (valid or not; structural_problems decides).

    Pipeline degrees need not divide the layers (uneven stages); interleaving takes every degree that
    divides the layers per stage; pipelines also try ZB-H1; ZeRO-3 also tries HSDP sharded within a node.
    Sequence parallelism always accompanies tensor parallelism (same bytes, less memory and elementwise
    work) unless `fixed` pins sp=False. A pinned field joins the grid: a pinned interleaving degree, HSDP
    shard group, micro-batch size or recompute policy is searched even where the default grid lacks it
    (structural_problems then decides whether it can run). n_experts > 1 (MoE) adds every expert-parallel
    degree that divides the experts and tp*cp*dp."""
    fixed = fixed or {}
    sps = (False,) if fixed.get("sp") is False else (True,)
    mbs = (fixed["micro_batch"],) if "micro_batch" in fixed else training.micro_batch_sizes
    rcs = (fixed["recompute"],) if "recompute" in fixed else RECOMPUTE_MODES
    for tp in _pinned(fixed, "tp", _divisors(n_gpus)):
        for cp in _pinned(fixed, "cp", _divisors(n_gpus // tp)):
            for pp in _pinned(fixed, "pp", [p for p in _divisors(n_gpus // (tp * cp)) if p <= n_layers]):
                dp = n_gpus // (tp * cp * pp)
                if "dp" in fixed and fixed["dp"] != dp:
                    continue
                eps = _pinned(fixed, "ep", _ep_choices(n_experts, tp * cp * dp))
                schedules = [(v, False) for v in _vpp_choices(pp, n_layers)] + ([(1, True)] if pp > 1 else [])
                if "vpp" in fixed and pp > 1 and (fixed["vpp"], False) not in schedules:
                    schedules.append((fixed["vpp"], False))  # a pinned interleaving need not divide the layers
                d = dp * cp
                zeros: list[tuple[int, int]] = [(0, 0)]
                if d > 1:
                    zeros = [(0, 0), (1, 0), (2, 0), (3, 0)]
                    node_shard = gpus_per_node // tp
                    if 1 < node_shard < d and d % node_shard == 0:
                        zeros.append((3, node_shard))
                    if fixed.get("shard") and (3, fixed["shard"]) not in zeros:
                        zeros.append((3, fixed["shard"]))
                for sp in (sps if tp > 1 else (False,)):
                    for vpp, zb in schedules:
                        for zero, shard in zeros:
                            for rc in rcs:
                                for mb in mbs:
                                    for ep in eps:
                                        yield PlanConfig(tp, sp, pp, vpp, cp, dp, zero, rc, mb, zb, shard, ep)


def _pinned(fixed: dict[str, Any], name: str, choices: list[int]) -> list[int]:
    """The grid's choices for a degree, or only the pinned value when it is one of them (a degree that
    does not divide the GPUs stays out: pinned_misses says why)."""
    if name not in fixed:
        return choices
    return [fixed[name]] if fixed[name] in choices else []


def kpis_for(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, t: TimeBreakdown) -> Kpis:
    n, step = cluster.n_gpus, t.step_s
    tokens = training.global_batch_tokens
    tok_s = tokens / step
    peak = cluster.gpu.peak_tflops("bf16")
    model_fpt = model.model_flops_per_token(training.seq_len)
    hw_fpt = model.hardware_flops_per_token(training.seq_len, cfg.recompute, training.recompute_modules)
    price = cluster.price_per_gpu_hour
    dollars = kpi.cost_per_step(n, price, step) if price is not None else None
    energy = kpi.modeled_energy_j(n, cluster.gpu.tdp_w, step, cluster.power_fraction)
    days = training.train_tokens / tok_s / 86400.0
    return Kpis(tok_s, tok_s / n, kpi.utilization(tok_s, model_fpt, n, peak), kpi.utilization(tok_s, hw_fpt, n, peak),
                tok_s * model_fpt / n / 1e12, dollars, dollars / tokens * 1e6 if dollars is not None else None,
                energy, tokens / energy, days,
                dollars * training.train_tokens / tokens if dollars is not None else None)


def evaluate(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
             efficiency: Efficiency | None = None, *, allow_uneven_layers: bool = True,
             memo: dict[tuple[Any, ...], Any] | None = None) -> PlanResult:
    """One plan: its structural problems, or its memory, time and KPIs (infeasible if over memory).

    efficiency defaults to the calibrated constants of the cluster's GPU (Efficiency.for_gpu); memo (one
    dict per model, training, cluster and efficiency) shares per-layer terms between plans."""
    efficiency = efficiency or Efficiency.for_gpu(cluster.gpu.key)
    problems = structural_problems(cfg, model, cluster.n_gpus, training.global_batch_seqs, training.seq_len,
                                   allow_uneven_layers=allow_uneven_layers, pp_round=training.pp_round,
                                   offload_layers=training.offload_activation_layers)
    if problems:
        return PlanResult(cfg, cluster, None, None, reasons=tuple(problems))
    mem = memory_breakdown(model, cfg, training, cluster, memo)
    t = step_time(model, cfg, training, cluster, efficiency, memo)
    reasons: tuple[str, ...] = ()
    if not mem.fits:
        reasons = (f"needs {mem.total_bytes / 1e9:.2f} GB per GPU on the {mem.stage} stage, "
                   f"{cluster.gpu.key} has {mem.capacity_bytes / 1e9:.1f} GB, {mem.usable_bytes / 1e9:.1f} usable "
                   f"at headroom {training.memory_headroom:.2f}",)
    return PlanResult(cfg, cluster, mem, t, model, training, reasons)


def _as_model(model: str | ModelDims | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, ModelDims):
        return ModelSpec(model)
    if isinstance(model, str):
        moe = get_moe_model(model)
        if moe is not None:
            return ModelSpec(moe.dims, moe=moe.moe, mla=moe.mla)
        return ModelSpec(get_model(model))
    raise TypeError(f"model must be a preset name, ModelDims or ModelSpec, got {type(model).__name__}")


def _as_clusters(cluster: str | Cluster | Sequence[str | Cluster]) -> list[Cluster]:
    items = [cluster] if isinstance(cluster, str | Cluster) else list(cluster)
    if not items:
        raise ValueError("at least one cluster is needed")
    out = []
    for c in items:
        if isinstance(c, str):
            out.append(make_cluster(c))
        elif isinstance(c, Cluster):
            out.append(c)
        else:
            raise TypeError(f"cluster must be 'COUNTxGPU' text or a Cluster, got {type(c).__name__}")
    return out


def _matches(cfg: PlanConfig, fixed: dict[str, Any]) -> bool:
    return all(getattr(cfg, k) == v for k, v in fixed.items())


def plan(model: PlanRequest | str | ModelDims | ModelSpec,
         cluster: str | Cluster | Sequence[str | Cluster] | None = None, training: Training | None = None, *,
         efficiency: Efficiency | None = None, rank_by: str = "time", fixed: dict[str, Any] | None = None,
         configs: Iterable[PlanConfig] | None = None, profile: StackProfile | None = None) -> SearchResult:
    """Search every plan of `model` on each cluster and rank the feasible ones.

    plan(PlanRequest(...)) is the `wavefront plan` job (job.py): the request carries everything and the
    result's document() is the --json document. The other form takes the pieces: fixed pins plan fields
    (e.g. {"tp": 8, "recompute": "selective"}); configs replaces the grid with the given plans (their
    structural problems are reported like any other).
    """
    if isinstance(model, PlanRequest):
        return _run_request(model)
    if cluster is None:
        raise ValueError("plan() needs a cluster (or a PlanRequest)")
    start = _time.perf_counter()
    spec = _as_model(model)
    clusters = _as_clusters(cluster)
    if training is None:
        seq = spec.dims.seq_len
        training = Training(global_batch_tokens=max(seq, DEFAULT_BATCH_TOKENS // seq * seq), seq_len=seq)
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(PlanConfig.__dataclass_fields__) - set(TRAINING_FIX)
    if unknown:
        raise ValueError(f"unknown plan fields {sorted(unknown)}; known: "
                         f"{sorted(PlanConfig.__dataclass_fields__) + list(TRAINING_FIX)}")
    # a pinned schedule setting of the training (Llama 3's round size N) is set on it, not matched per plan
    training = replace(training, **{k: fixed.pop(k) for k in TRAINING_FIX if k in fixed})

    feasible: list[PlanResult] = []
    oom: list[PlanResult] = []
    rejected: Counter[str] = Counter()
    n_enum = 0
    for cl in clusters:
        grid = configs if configs is not None else enumerate_configs(
            cl.n_gpus, training, spec.dims.n_layers, gpus_per_node=cl.gpus_per_node, fixed=fixed,
            n_experts=spec.moe.n_experts if spec.moe else 0)
        memo: dict[tuple[Any, ...], Any] = {}
        eff = efficiency or (profile.efficiency(cl.gpu.key) if profile else Efficiency.for_gpu(cl.gpu.key))
        for cfg in grid:
            if fixed and not _matches(cfg, fixed):
                continue
            n_enum += 1
            res = evaluate(spec, cfg, training, cl, eff, memo=memo)
            if res.memory is None:
                rejected[res.reasons[0]] += 1
            elif res.feasible:
                feasible.append(res)
            else:
                oom.append(res)

    feasible = rank_plans(feasible, rank_by)
    oom.sort(key=lambda r: _m(r).total_bytes / _m(r).capacity_bytes)
    misses = (pinned_misses(fixed, clusters, training, spec.dims.n_layers, spec.moe.n_experts if spec.moe else 0)
              if fixed and n_enum == 0 else [])
    gpu0 = clusters[0].gpu.key
    first = efficiency or (profile.efficiency(gpu0) if profile else Efficiency.for_gpu(gpu0))
    warnings = batch_warnings(training, clusters)
    if training.pp_round:
        warnings.append(f"pipeline round size N = {training.pp_round} (Llama 3's schedule): memory holds its "
                        "in-flight chunks and the step time its bubbles, both from running its order "
                        "(a round below pp waits on the pipeline's round trip; one of pp - 2 or fewer, over "
                        "several rounds, deadlocks and is refused)")
    return SearchResult(spec, clusters, training, first, rank_by, feasible, oom, rejected, n_enum,
                        _time.perf_counter() - start, warnings, misses, profile=profile)


def _run_request(req: PlanRequest) -> SearchResult:
    if req.rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {RANK_BY}, got {req.rank_by!r}")
    if req.top < 0:
        raise ValueError(f"--top must be >= 0, got {req.top}")
    spec = req.model_spec()
    clusters = req.clusters()
    if req.calibrate and len({c.gpu.key for c in clusters}) > 1:
        raise ValueError("--calibrate measures one GPU; compare clusters of other GPUs without it")
    profile, deprecation = req.profile()
    result = plan(spec, clusters, req.training(spec), efficiency=req.efficiency(clusters[0]), rank_by=req.rank_by,
                  fixed=dict(req.fixed), profile=profile)
    result.top = req.top
    result.constants_from = req.constants_from(clusters)
    result.defaulted = list(req.defaulted)
    result.warnings[:0] = [deprecation] if deprecation else []
    return result


#: Significant figures of the ranked quantity (step time, or $/step) that the ranking compares: plans
#: equal to this many figures tie, and ties go to the plan with less memory per GPU (then the label, so
#: the order is total). The table prints the ranked quantity to the same figures, so its column never
#: decreases down the rows (the order the header states).
RANK_FIGURES = 4
TIE_RULE = f"equal to {RANK_FIGURES} significant figures: less memory per GPU first"


def rank_value(x: float) -> float:
    """x rounded to RANK_FIGURES significant figures (what the ranking compares and the table prints)."""
    return float(f"{x:.{RANK_FIGURES - 1}e}") if x else 0.0


def rank_text(x: float) -> str:
    """rank_value(x) in plain notation, as the table prints it (59.16, 0.8124, 1234)."""
    v = rank_value(x)
    if v == 0:
        return "0"
    return f"{v:.{max(0, RANK_FIGURES - 1 - math.floor(math.log10(abs(v))))}f}"


def rank_key(r: PlanResult, rank_by: str = "time") -> tuple[Any, ...]:
    """Ascending: the ranked quantity at RANK_FIGURES figures, then memory, then the label."""
    step = rank_value(_t(r).step_s)
    if rank_by == "cost":
        dollars = _k(r).dollars_per_step
        return (rank_value(dollars) if dollars is not None else float("inf"), step, _m(r).total_bytes,
                r.cluster.label, r.config.label())
    return (step, _m(r).total_bytes, r.cluster.label, r.config.label())


def rank_plans(plans: list[PlanResult], rank_by: str = "time") -> list[PlanResult]:
    """Best first, strictly by rank_key: step time (or $/step, then step time) to RANK_FIGURES figures;
    ties: less memory first (TIE_RULE)."""
    return sorted(plans, key=lambda r: rank_key(r, rank_by))


def batch_warnings(training: Training, clusters: list[Cluster]) -> list[str]:
    """Warn when the global batch is tiny for the cluster: fewer sequences than GPUs caps data
    parallelism and forces model parallelism onto every plan (405B on 16K GPUs at a 4M-token batch)."""
    out = []
    for cl in clusters:
        seqs = training.global_batch_seqs
        if seqs < cl.n_gpus:
            out.append(f"global batch of {seqs:,} sequences for {cl.n_gpus:,} GPUs ({seqs / cl.n_gpus:.2f} per GPU) "
                       f"on {cl.label}: data parallelism is capped at {seqs:,}, so every plan needs "
                       f"tp*cp*pp >= {-(-cl.n_gpus // seqs)}; raise --global-batch-tokens or use fewer GPUs")
        elif seqs < 2 * cl.n_gpus:
            out.append(f"global batch of {seqs:,} sequences for {cl.n_gpus:,} GPUs on {cl.label}: at most "
                       f"{seqs / cl.n_gpus:.2f} per GPU, so pipelines have few micro-batches and large bubbles")
    return out


def pinned_misses(fixed: dict[str, Any], clusters: list[Cluster], training: Training, n_layers: int,
                  n_experts: int = 0) -> list[str]:
    """For each pinned field whose value no grid plan has, what the default grid offers instead; if every
    value exists alone (or is one the search adds when pinned), say that the combination is what no plan has."""
    out = []
    for cl in clusters:
        grid = list(enumerate_configs(cl.n_gpus, training, n_layers, gpus_per_node=cl.gpus_per_node,
                                      fixed={k: v for k, v in fixed.items() if k == "sp"}, n_experts=n_experts))
        for name, value in fixed.items():
            offered = sorted({getattr(c, name) for c in grid}, key=str)
            if value not in offered:
                shown = ", ".join(str(v) for v in offered[:24]) + (" ..." if len(offered) > 24 else "")
                out.append(f"{name}={value} is not in the grid on {cl.label}: it has {name} in {{{shown}}}"
                           + _why_missing(name, value, cl.n_gpus, n_layers, training, n_experts))
    if not out:
        out.append("each pinned value exists in the grid, but no plan combines them all (the degrees' product "
                   f"must equal the GPU count; the pinned ones are {fixed})")
    return out


def _why_missing(name: str, value: object, n_gpus: int, n_layers: int, training: Training, n_experts: int = 0) -> str:
    if name in ("tp", "cp", "pp", "dp") and isinstance(value, int) and value > 0 and n_gpus % value:
        return f" ({value} does not divide {n_gpus} GPUs)"
    if name == "ep":
        return (" (expert-parallel degrees divide the experts and tp*cp*dp)" if n_experts > 1
                else " (expert parallelism needs a mixture-of-experts model)")
    if name == "vpp":
        return " (interleaving needs pipeline parallel > 1; a pinned degree is searched with every pp > 1)"
    if name == "micro_batch":
        return f" (micro-batch sizes come from Training.micro_batch_sizes = {training.micro_batch_sizes})"
    if name == "recompute":
        return f" (policies: {', '.join(RECOMPUTE_MODES)})"
    return ""


def _biggest_difference(a: PlanResult, b: PlanResult) -> tuple[str, float]:
    pa, pb = _t(a).parts(), _t(b).parts()
    name = max(pa, key=lambda k: abs(pb[k] - pa[k]))
    return name, pb[name] - pa[name]


def explain(result: SearchResult, n_runner_ups: int = 4) -> list[str]:
    """Sentences: why the winner wins (its largest costs) and what each runner-up loses on."""
    best = result.best
    if best is None:
        if result.n_enumerated == 0:
            return ["no plan matches the pinned fields:", *result.pinned_misses]
        if not result.out_of_memory:
            reasons = "; ".join(f"{n} x {why}" for why, n in result.rejected.most_common(3))
            return [f"no valid plan: {reasons}"]
        closest = result.out_of_memory[0]
        lines = ["no plan fits in memory", f"closest: {closest.config.label()} ({closest.reasons[0]})"]
        mem = _m(closest)
        if mem.fits_device:  # within the device, over the search's margin for the model's error
            need = math.ceil(mem.total_bytes / mem.capacity_bytes * 1000) / 1000
            lines.append(f"it fits the device with fragmentation counted ({mem.total_bytes / 1e9:.1f} of "
                         f"{mem.capacity_bytes / 1e9:.1f} GB); the headroom is the margin for this model's "
                         f"error: --memory-headroom {need:.3f} admits it")
        return lines
    t = _t(best)
    parts = sorted(t.parts().items(), key=lambda kv: -kv[1])
    shares = ", ".join(f"{k} {v / t.step_s:.0%}" for k, v in parts if v > 0.005 * t.step_s)
    lines = [f"winner {best.config.label()} on {best.cluster.label}: {t.step_s:.3f} s/step "
             f"({shares}); {_m(best).total_bytes / 1e9:.1f} of {_m(best).capacity_bytes / 1e9:.1f} GB, "
             f"{_m(best).allocator_bytes / 1e9:.1f} GB of it the allocator allowance (fragmentation)"]
    near = [r for r in result.ranked[1:] if _t(r).step_s <= t.step_s * (1.0 + NEAR_TIE)]
    if near and result.rank_by == "time":
        leanest = min(near, key=lambda r: _m(r).total_bytes)
        lines[0] += (f"; {len(near)} more plan(s) within {NEAR_TIE:.0%} of it (inside the model's error), the "
                     f"leanest {leanest.config.label()} at {_m(leanest).total_bytes / 1e9:.1f} GB")
    for i, other in enumerate(result.ranked[1:1 + n_runner_ups], start=2):
        name, delta = _biggest_difference(best, other)
        slower = _t(other).step_s / t.step_s - 1.0
        lines.append(f"#{i} {other.config.label()} on {other.cluster.label}: {slower:+.1%} step time, "
                     f"mostly {name} {delta:+.3f} s; {_m(other).total_bytes / 1e9:.1f} GB")
    return lines
