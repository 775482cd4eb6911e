"""Cluster planner: an analytic cost model (memory, step time, MFU, $/step, energy/step) and a search
over parallel plans, calibrated by `wavefront comm` measurements and validated against published runs.

    from wavefront.workbench.planner import PlanRequest, plan
    result = plan(PlanRequest(model="llama3-70b", gpus=("64xh100",)))   # the `wavefront plan` job
    result.best.time.step_s, result.best.memory.total_bytes, result.explain(), result.as_dict()
    plan("llama3-70b", "64xh100")                                        # the same search from parts

Formulas and their sources are in the module docstrings: model.py (parameters, FLOPs, activation memory
per checkpointing policy), kernels.py (GEMM, attention and FP8 cast kernels from their shapes), memory.py
(ZeRO/FSDP/HSDP states, per-rank pipeline memory, allocator headroom), pipeline.py (layers per chunk and
the micro-batches a schedule keeps in flight, from its order), time.py (compute,
communication, bubble, overlap), cluster.py (topology and hierarchical collectives), search.py (grid and
ranking), job.py (the request/document of `wavefront plan`), validation.py (published runs, the split, the
fit). numpy-free and torch-free: importing it never loads torch or triton.
"""

from wavefront.workbench.planner.cluster import Cluster, Link, make_cluster, parse_gpus
from wavefront.workbench.planner.job import SCHEMA, CustomDims, PlanRequest
from wavefront.workbench.planner.memory import MemoryBreakdown, memory_breakdown
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.parallel import PlanConfig
from wavefront.workbench.planner.search import Kpis, PlanResult, SearchResult, evaluate, plan
from wavefront.workbench.planner.time import TimeBreakdown, step_time
from wavefront.workbench.planner.training import Efficiency, Training

__all__ = [
    "SCHEMA", "Cluster", "CustomDims", "Efficiency", "Kpis", "Link", "MemoryBreakdown", "ModelSpec", "PlanConfig",
    "PlanRequest", "PlanResult", "SearchResult", "TimeBreakdown", "Training", "evaluate", "make_cluster",
    "memory_breakdown", "parse_gpus", "plan", "step_time",
]
