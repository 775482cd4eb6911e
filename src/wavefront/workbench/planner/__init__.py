"""Cluster planner: an analytic cost model (memory, step time, MFU, $/step, energy/step) and a search
over parallel plans, calibrated by `wavefront comm` measurements and validated against published runs.

    from wavefront.workbench.planner import plan
    result = plan("llama3-70b", "64xh100")
    result.best.time.step_s, result.best.memory.total_bytes, result.explain()

Formulas and their sources are in the module docstrings: model.py (parameters, FLOPs, Korthikanti
activation memory), memory.py (ZeRO states, pipeline in-flight micro-batches), time.py (compute,
communication, bubble, overlap), cluster.py (links and collective cost), search.py (grid and ranking).
"""

from wavefront.workbench.planner.cluster import Cluster, Link, make_cluster, parse_gpus
from wavefront.workbench.planner.memory import MemoryBreakdown, memory_breakdown
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.parallel import PlanConfig
from wavefront.workbench.planner.search import Kpis, PlanResult, SearchResult, evaluate, plan
from wavefront.workbench.planner.time import TimeBreakdown, step_time
from wavefront.workbench.planner.training import Efficiency, Training

__all__ = [
    "Cluster", "Efficiency", "Kpis", "Link", "MemoryBreakdown", "ModelSpec", "PlanConfig", "PlanResult",
    "SearchResult", "TimeBreakdown", "Training", "evaluate", "make_cluster", "memory_breakdown", "parse_gpus",
    "plan", "step_time",
]
