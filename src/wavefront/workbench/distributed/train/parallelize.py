"""Apply a layout to a model: the pipeline cut first, then per stage TP, CP, EP and data parallelism
(dimensions.py), in torchtitan's order. Single process, DDP and FSDP2 are degenerate layouts of the one mesh
(mesh.resolve): every run builds the mesh and goes through here.

Why this order: the cut decides which modules a rank holds at all, so it comes first; TP turns weights into
DTensors that FSDP2 then shards along a second mesh dimension; CP only reroutes attention; EP splits the
experts before data parallelism, which must leave them out of its reduction; data parallelism wraps what
the others left. To add a dimension: a degree on :class:`mesh.Layout` and one function in dimensions.py,
placed in :func:`dimensions.parallelize_stage` (docs/developing.md).
"""

from __future__ import annotations

from torch import nn

from wavefront.workbench.distributed.train import pipeline
from wavefront.workbench.distributed.train.dimensions import (
    Parallelized,
    ParallelOptions,
    finish_backward,
    parallelize_stage,
)
from wavefront.workbench.distributed.train.mesh import Layout

__all__ = ["Parallelized", "ParallelOptions", "finish_backward", "parallelize"]


def parallelize(model: nn.Module, layout: Layout, mesh, opts: ParallelOptions) -> Parallelized:
    """`model` (on its device) parallelized in place over `mesh`; ``.module`` is what trains."""
    if layout.pp > 1:
        return pipeline.build_stages(model, mesh, layout, opts)[1]
    return parallelize_stage(Parallelized(model, root=model), mesh, layout, opts)
