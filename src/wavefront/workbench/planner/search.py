"""Enumerate every parallel plan for a model on a cluster, evaluate it, rank the feasible ones.

The grid: tensor parallel (with and without sequence parallel) x context parallel x pipeline parallel
over the divisors of the GPU count, data parallel filling the rest; interleaved schedules with 2 and 4
virtual stages; ZeRO 0-3; recomputation none / selective / full; the micro-batch sizes of Training.
Plans that cannot run (a degree not dividing heads, layers or the batch) are counted by reason; plans that
run out of memory are kept as infeasible with their memory breakdown. Feasible plans are ranked by step
time ("time") or by dollars per step ("cost", which also compares clusters).
"""

from __future__ import annotations

import time as _time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from wavefront.shapes import ModelDims, get_model
from wavefront.workbench import kpi
from wavefront.workbench.planner.cluster import Cluster, make_cluster
from wavefront.workbench.planner.memory import MemoryBreakdown, memory_breakdown
from wavefront.workbench.planner.model import RECOMPUTE_MODES, ModelSpec
from wavefront.workbench.planner.parallel import ZERO_STAGES, PlanConfig, structural_problems
from wavefront.workbench.planner.time import TimeBreakdown, step_time
from wavefront.workbench.planner.training import Efficiency, Training

RANK_BY = ("time", "cost")
VPP_CHOICES = (1, 2, 4)
#: Default global batch: 4M tokens (Llama 3 405B's initial batch, Dubey et al. 2024, Sec. 3.4.1).
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024


@dataclass(frozen=True)
class Kpis:
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # model FLOPs (PaLM convention) / bf16 dense peak
    hfu: float  # adds recomputation FLOPs
    model_tflops_per_gpu: float
    dollars_per_step: float | None
    dollars_per_million_tokens: float | None
    energy_per_step_j: float  # modeled: board power x Cluster.power_fraction
    tokens_per_joule: float
    time_to_train_days: float
    dollars_to_train: float | None

    def as_dict(self) -> dict:
        return dict(vars(self))


@dataclass(frozen=True)
class PlanResult:
    config: PlanConfig
    cluster: Cluster
    memory: MemoryBreakdown | None
    time: TimeBreakdown | None
    kpis: Kpis | None
    reasons: tuple[str, ...] = ()  # why the plan is infeasible; empty when feasible

    @property
    def feasible(self) -> bool:
        return not self.reasons

    def as_dict(self) -> dict:
        return {
            "cluster": self.cluster.label, "config": self.config.as_dict(), "feasible": self.feasible,
            "reasons": list(self.reasons),
            "memory": self.memory.as_dict() if self.memory else None,
            "time": self.time.as_dict() if self.time else None,
            "kpis": self.kpis.as_dict() if self.kpis else None,
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
    rejected: Counter = field(default_factory=Counter)  # structural reason -> count
    n_enumerated: int = 0
    elapsed_s: float = 0.0

    @property
    def best(self) -> PlanResult | None:
        return self.ranked[0] if self.ranked else None

    @property
    def n_evaluated(self) -> int:
        return len(self.ranked) + len(self.out_of_memory)

    def explain(self, n_runner_ups: int = 4) -> list[str]:
        return explain(self, n_runner_ups)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def enumerate_configs(n_gpus: int, training: Training, n_layers: int) -> Iterator[PlanConfig]:
    """Every point of the plan grid for n_gpus (valid or not; structural_problems decides)."""
    for tp in _divisors(n_gpus):
        for cp in _divisors(n_gpus // tp):
            for pp in _divisors(n_gpus // (tp * cp)):
                dp = n_gpus // (tp * cp * pp)
                vpps = [v for v in VPP_CHOICES if v == 1 or (pp > 1 and n_layers % (pp * v) == 0)]
                zeros = ZERO_STAGES if dp * cp > 1 else (0,)
                for sp in ((False, True) if tp > 1 else (False,)):
                    for vpp in vpps:
                        for zero in zeros:
                            for rc in RECOMPUTE_MODES:
                                for mb in training.micro_batch_sizes:
                                    yield PlanConfig(tp, sp, pp, vpp, cp, dp, zero, rc, mb)


def kpis_for(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, t: TimeBreakdown) -> Kpis:
    n, step = cluster.n_gpus, t.step_s
    tokens = training.global_batch_tokens
    tok_s = tokens / step
    peak = cluster.gpu.peak_tflops("bf16")
    model_fpt = model.model_flops_per_token(training.seq_len)
    hw_fpt = model.hardware_flops_per_token(training.seq_len, cfg.recompute)
    price = cluster.price_per_gpu_hour
    dollars = kpi.cost_per_step(n, price, step) if price is not None else None
    energy = kpi.modeled_energy_j(n, cluster.gpu.tdp_w, step, cluster.power_fraction)
    days = training.train_tokens / tok_s / 86400.0
    return Kpis(tok_s, tok_s / n, kpi.utilization(tok_s, model_fpt, n, peak), kpi.utilization(tok_s, hw_fpt, n, peak),
                tok_s * model_fpt / n / 1e12, dollars, dollars / tokens * 1e6 if dollars is not None else None,
                energy, tokens / energy, days,
                dollars * training.train_tokens / tokens if dollars is not None else None)


def evaluate(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
             efficiency: Efficiency | None = None, *, allow_uneven_layers: bool = False) -> PlanResult:
    """One plan: its structural problems, or its memory, time and KPIs (infeasible if over memory).

    efficiency defaults to the calibrated constants of the cluster's GPU (Efficiency.for_gpu)."""
    efficiency = efficiency or Efficiency.for_gpu(cluster.gpu.key)
    problems = structural_problems(cfg, model, cluster.n_gpus, training.global_batch_seqs, training.seq_len,
                                   allow_uneven_layers=allow_uneven_layers)
    if problems:
        return PlanResult(cfg, cluster, None, None, None, tuple(problems))
    mem = memory_breakdown(model, cfg, training, cluster)
    t = step_time(model, cfg, training, cluster, efficiency)
    reasons = ()
    if not mem.fits:
        reasons = (f"needs {mem.total_bytes / 1e9:.2f} GB per GPU on the {mem.stage} stage, "
                   f"{cluster.gpu.key} has {mem.capacity_bytes / 1e9:.0f} GB",)
    return PlanResult(cfg, cluster, mem, t, kpis_for(model, cfg, training, cluster, t), reasons)


def _as_model(model: str | ModelDims | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, ModelDims):
        return ModelSpec(model)
    if isinstance(model, str):
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


def _matches(cfg: PlanConfig, fixed: dict) -> bool:
    return all(getattr(cfg, k) == v for k, v in fixed.items())


def plan(model: str | ModelDims | ModelSpec, cluster: str | Cluster | Sequence[str | Cluster],
         training: Training | None = None, *, efficiency: Efficiency | None = None, rank_by: str = "time",
         fixed: dict | None = None, configs: Iterable[PlanConfig] | None = None) -> SearchResult:
    """Search every plan of `model` on each cluster and rank the feasible ones.

    fixed pins plan fields (e.g. {"tp": 8, "recompute": "selective"}); configs replaces the grid with
    the given plans (their structural problems are reported like any other).
    """
    start = _time.perf_counter()
    spec = _as_model(model)
    clusters = _as_clusters(cluster)
    if training is None:
        seq = spec.dims.seq_len
        training = Training(global_batch_tokens=max(seq, DEFAULT_BATCH_TOKENS // seq * seq), seq_len=seq)
    if rank_by not in RANK_BY:
        raise ValueError(f"rank_by must be one of {RANK_BY}, got {rank_by!r}")
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(PlanConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown plan fields {sorted(unknown)}; known: {sorted(PlanConfig.__dataclass_fields__)}")

    feasible: list[PlanResult] = []
    oom: list[PlanResult] = []
    rejected: Counter = Counter()
    n_enum = 0
    for cl in clusters:
        grid = configs if configs is not None else enumerate_configs(cl.n_gpus, training, spec.dims.n_layers)
        for cfg in grid:
            if fixed and not _matches(cfg, fixed):
                continue
            n_enum += 1
            res = evaluate(spec, cfg, training, cl, efficiency or Efficiency.for_gpu(cl.gpu.key))
            if res.memory is None:
                rejected[res.reasons[0]] += 1
            elif res.feasible:
                feasible.append(res)
            else:
                oom.append(res)

    if rank_by == "time":
        feasible.sort(key=lambda r: (r.time.step_s, r.memory.total_bytes))
    else:
        feasible.sort(key=lambda r: (r.kpis.dollars_per_step if r.kpis.dollars_per_step is not None
                                     else float("inf"), r.time.step_s))
    oom.sort(key=lambda r: r.memory.total_bytes / r.memory.capacity_bytes)
    return SearchResult(spec, clusters, training, efficiency or Efficiency.for_gpu(clusters[0].gpu.key), rank_by,
                        feasible, oom, rejected, n_enum,
                        _time.perf_counter() - start)


def _biggest_difference(a: PlanResult, b: PlanResult) -> tuple[str, float]:
    pa, pb = a.time.parts(), b.time.parts()
    name = max(pa, key=lambda k: abs(pb[k] - pa[k]))
    return name, pb[name] - pa[name]


def explain(result: SearchResult, n_runner_ups: int = 4) -> list[str]:
    """Sentences: why the winner wins (its largest costs) and what each runner-up loses on."""
    best = result.best
    if best is None:
        if result.n_enumerated == 0:
            return ["no plan matches the pinned fields"]
        if not result.out_of_memory:
            reasons = "; ".join(f"{n} x {why}" for why, n in result.rejected.most_common(3))
            return [f"no valid plan: {reasons}"]
        closest = result.out_of_memory[0]
        return ["no plan fits in memory", f"closest: {closest.config.label()} ({closest.reasons[0]})"]
    t = best.time
    parts = sorted(t.parts().items(), key=lambda kv: -kv[1])
    shares = ", ".join(f"{k} {v / t.step_s:.0%}" for k, v in parts if v > 0.005 * t.step_s)
    lines = [f"winner {best.config.label()} on {best.cluster.label}: {t.step_s:.3f} s/step "
             f"({shares}); {best.memory.total_bytes / 1e9:.1f} of {best.memory.capacity_bytes / 1e9:.0f} GB"]
    for i, other in enumerate(result.ranked[1:1 + n_runner_ups], start=2):
        name, delta = _biggest_difference(best, other)
        slower = other.time.step_s / t.step_s - 1.0
        lines.append(f"#{i} {other.config.label()} on {other.cluster.label}: {slower:+.1%} step time, "
                     f"mostly {name} {delta:+.3f} s; {other.memory.total_bytes / 1e9:.1f} GB")
    return lines
