"""Apply a layout to a model: the pipeline cut first, then per stage TP, CP, EP and data parallelism
(dimensions.py), in torchtitan's order. Single process, DDP and FSDP2 are degenerate layouts of the one mesh
(mesh.for_plan): every run builds the mesh and goes through here.

Why this order: the cut decides which modules a rank holds at all, so it comes first; TP turns weights into
DTensors that FSDP2 then shards along a second mesh dimension; CP only reroutes attention; EP splits the
experts before data parallelism, which must leave them out of its reduction; data parallelism wraps what
the others left. To add a dimension: a degree on :class:`mesh.Layout` and one function in dimensions.py,
placed in :func:`dimensions.parallelize_stage` (docs/developing.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from wavefront.workbench.distributed.train import pipeline
from wavefront.workbench.distributed.train.dimensions import (
    Parallelized,
    ParallelOptions,
    finish_backward,
    parallelize_stage,
)
from wavefront.workbench.distributed.train.mesh import Layout

__all__ = ["Parallelized", "ParallelOptions", "RunLayout", "finish_backward", "parallelize", "resolve"]


@dataclass(frozen=True)
class RunLayout:
    """The layout a launch runs and how the run reports it."""

    layout: Layout
    label: str  # provenance "parallel": the --parallel name, or "mesh <label>"
    document: dict | None  # provenance "layout": the mesh's degrees when asked for as a mesh
    #: asked for as a mesh (not a --parallel name): the run reports the planner's prediction (predict.py) and,
    #: when profiled, the communication per mesh dimension (as FSDP2 runs do)
    as_mesh: bool


def resolve(cfg, world_size: int) -> RunLayout:
    """The run's layout: the mesh options, or the degenerate mesh its ``--parallel`` name stands for."""
    plan = cfg.resolve_parallel(world_size)
    layout = cfg.run_layout(world_size)
    if plan == "mesh":
        return RunLayout(layout, f"mesh {layout.label()}", layout.as_dict(), True)
    return RunLayout(layout, plan, None, False)


def parallelize(model: nn.Module, layout: Layout, mesh, opts: ParallelOptions) -> Parallelized:
    """`model` (on its device) parallelized in place over `mesh`; ``.module`` is what trains."""
    if layout.pp > 1:
        return pipeline.build_stages(model, mesh, layout, opts)[1]
    return parallelize_stage(Parallelized(model, root=model), mesh, layout, opts)
