"""``wavefront comm`` and ``wavefront overlap``: collective benchmarks with alpha-beta fits (saved as the
planner's calibration), and compute/communication overlap probes. Every rank of a launched job calls the job;
rank 0 gets the result, the others None.

    from wavefront.workbench.jobs import comm
    comm.comm(comm.CommRequest(ops=("all_reduce",))).as_dict()          # wavefront.comm/1 (rank 0)
    comm.overlap(comm.OverlapRequest()).as_dict()                       # wavefront.overlap/2 (rank 0)
"""

from __future__ import annotations

from wavefront.workbench.distributed import comm as collectives
from wavefront.workbench.distributed import overlap as overlap_probe
from wavefront.workbench.distributed.comm import CommJobResult, CommRequest
from wavefront.workbench.distributed.overlap import OverlapJobResult, OverlapRequest
from wavefront.workbench.jobs.request import ProgressFn

__all__ = ["CommJobResult", "CommRequest", "OverlapJobResult", "OverlapRequest", "comm", "overlap"]


def comm(request: CommRequest, on_progress: ProgressFn | None = None) -> CommJobResult | None:
    """The collective benchmark on this rank (distributed.comm.run); rank 0 reports progress per case."""
    return collectives.run(request, on_progress)


def overlap(request: OverlapRequest) -> OverlapJobResult | None:
    """The overlap probes and the DDP bucket sweep on this rank (distributed.overlap.run)."""
    return overlap_probe.run(request)
