"""``wavefront roofline``: every bench case of every (or the named) op on a device of the table, with
matrix use from an inspect document (else Triton's front end), kernel bytes from a traffic document and
measured times from JSON records or a results store.

    from wavefront.workbench.jobs import roofline
    roofline.roofline(roofline.RooflineRequest(device="mi300x", ops=("softmax",))).as_dict()   # wavefront.roofline/1
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from wavefront.workbench.bench.store import StoreError, open_run
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.jobs.ops import check_ops, torch_dtype
from wavefront.workbench.jobs.request import RequestError, read_document
from wavefront.workbench.static import roofline as rl


@dataclass(frozen=True)
class RooflineRequest:
    device: str = "h100"  # a device-table name
    ops: tuple[str, ...] = ()
    dtype: str = "bf16"
    traffic: str | None = None  # a `wavefront traffic --json` document
    inspect: str | None = None  # a `wavefront inspect --json` document (which ops use matrix units)
    measured: str | None = None  # JSON records of measured GPU times
    store: str | None = None  # a results store: the measured times of its run `run`
    run: str = "latest"


def roofline(request: RooflineRequest) -> rl.RooflineReport:
    """A RooflineReport (wavefront.roofline/1); see the module docstring."""
    check_ops(request.ops)
    try:
        gpu = get_gpu(request.device)
    except ValueError as exc:
        raise RequestError("device", str(exc)) from None
    dtype = torch_dtype(request.dtype)
    traffic_doc = read_document(request.traffic, "traffic") if request.traffic else None
    inspect_doc = read_document(request.inspect, "inspect") if request.inspect else None
    times: dict = {}
    if request.measured:
        try:
            times.update(rl.load_measured(request.measured))
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise RequestError("measured", f"cannot read {request.measured}: {exc}") from None
    if request.store is not None:
        times.update(measured_from_store(request.store, request.run))
    matrix = (rl.matrix_ops_from_inspect(inspect_doc) if inspect_doc is not None
              else rl.detect_matrix_ops(request.ops or None, target=gpu.arch))
    return rl.roofline(gpu, request.ops or None, dtype, matrix_ops=matrix, traffic=traffic_doc,
                       measured=times or None)


def measured_from_store(store: str | Path, run: str = "latest") -> dict:
    """The wavefront provider's median times of the stored GPU run `run` (static.roofline.measured_times)."""
    if Path(store).is_dir():
        raise RequestError("store", f"{store} is a directory; give the results store file")
    try:
        return rl.measured_times(open_run(run, store))
    except (StoreError, ValueError, sqlite3.Error) as exc:
        raise RequestError("store", f"{store}: {exc}") from None
