"""``wavefront train``: a training run per variant on this machine's ranks, with KPIs (tokens/s, MFU, memory,
$/step, energy/step) and the variants compared.

    from wavefront.workbench.jobs import train
    train.train(TrainConfig(preset="tiny", steps=10)).as_dict()                        # wavefront.train/1

`on_step(variant, record, total_steps)` is called on every step (a StepRecord: loss, tokens/s, ...).
"""

from __future__ import annotations

from collections.abc import Callable

from wavefront.workbench.distributed.train import harness
from wavefront.workbench.distributed.train.config import TrainConfig
from wavefront.workbench.distributed.train.harness import SCHEMA, TrainFailure, TrainResult, run_order, shutdown
from wavefront.workbench.distributed.train.kpi import StepRecord

__all__ = ["SCHEMA", "TrainConfig", "TrainFailure", "TrainResult", "run_order", "shutdown", "train"]


def train(cfg: TrainConfig, on_step: Callable[[str, StepRecord, int], None] | None = None) -> TrainResult:
    """Run every variant of `cfg` (distributed.train.harness.run). TrainFailure: a rank failed."""
    return harness.run(cfg, on_step=on_step)
