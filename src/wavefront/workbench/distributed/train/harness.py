"""The training harness behind ``wavefront train``: one code path, the device mesh, for every layout (a single
process, DDP and FSDP2 are degenerate ones), launched with torchrun (gloo on CPU, nccl/rccl on GPU).

``run(config)`` is called on every rank and returns a :class:`TrainResult` (data only; the CLI prints
and writes files). For each variant ("baseline" = unpatched Hugging Face, "wavefront" = patched) it
builds the model from the same seed, parallelizes it for the layout, trains on the same batches, and
measures the KPIs of :mod:`kpi` (trainer.py: build, parallelize, train_step). With ``--compare`` both
variants run back to back in one invocation.

Failure behaviour:

- every collective has a timeout (``--timeout``), so a dead or stuck rank ends the job instead of
  hanging it; a rank that raises exits at once, which closes its connections and makes its peers' next
  collective fail fast (torchrun also stops the remaining workers);
- each step all-reduces a status vector (loss, non-finite flag, stop flag) *before* the optimizer step,
  so a NaN/inf loss on any rank stops every rank at the same step, with the parameters untouched;
- SIGTERM (preemption, or torchrun stopping the job) is noted and honoured at the end of the current
  step: a checkpoint is written (when configured) and the run exits, to be continued with ``--resume``;
- whatever was measured before a failure is still written to the results store.
"""

from __future__ import annotations

import contextlib
import importlib.util
import platform
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import ClassVar

import torch
import torch.distributed as dist

from wavefront import runtime
from wavefront.workbench.distributed import launch as dist_launch
from wavefront.workbench.distributed.train import predict
from wavefront.workbench.distributed.train import store as train_store
from wavefront.workbench.distributed.train.config import ConfigError, TrainConfig
from wavefront.workbench.distributed.train.errors import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NONFINITE,
    TrainFailure,
)
from wavefront.workbench.distributed.train.kpi import StepRecord, Summary, compare, device_peak
from wavefront.workbench.distributed.train.presets import build_config
from wavefront.workbench.distributed.train.trainer import (
    STOP,
    Env,
    VariantResult,
    init,
    train,
    world_size_from_env,
)
from wavefront.workbench.document import encode

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NONFINITE", "SCHEMA", "TrainFailure", "TrainResult",
           "VariantResult", "run", "run_order", "shutdown", "unavailable", "world_size_from_env"]

#: The JSON document of a training run (:meth:`TrainResult.as_dict`); docs/json/train.md.
SCHEMA = "wavefront.train/1"


@dataclass
class TrainResult:
    run_id: str
    config: dict
    provenance: dict
    variants: list[VariantResult]
    comparison: dict | None  # wavefront vs the first variant (the reference), when both ran
    out_dir: str
    store: str | None
    comparisons: dict[str, dict] = field(default_factory=dict)  # every other variant vs the reference

    SCHEMA: ClassVar[str] = SCHEMA

    def as_dict(self) -> dict:
        """The ``wavefront train --json`` document."""
        return {"schema": SCHEMA, "run_id": self.run_id, "config": self.config, "provenance": self.provenance,
                "variants": encode(self.variants), "comparison": self.comparison,
                "comparisons": self.comparisons, "out_dir": self.out_dir, "store": self.store}


def _on_sigterm(signum, frame) -> None:
    STOP.set()


def run(cfg: TrainConfig, *, on_step: Callable[[str, StepRecord, int], None] | None = None) -> TrainResult:
    """Train every requested variant on this rank; see the module docstring. Raises ConfigError before any
    work for a bad configuration, TrainFailure (with an exit code) when the run stops."""
    cfg.validate(world_size_from_env())
    env = init(cfg)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    run_id = _broadcast_str(f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}")
    prov = _provenance(env)
    peak, device_row = device_peak(env.device, cfg.gpu, cfg.peak_tflops, env.bf16)
    measured_device = None
    if env.run.as_mesh and env.device.type == "cpu" and peak.tflops:
        measured_device = predict.measure(peak.tflops, env.device)
    results: list[VariantResult] = []
    for variant in run_order(cfg.variants):
        v = VariantResult(variant, "running")
        results.append(v)
        missing = unavailable(variant)
        if missing:
            v.status = f"skipped: {missing}"
            v.notes.append(f"{variant}: skipped, {missing}")
            continue
        try:
            train(cfg, env, variant, peak, device_row, Path(cfg.out_dir), on_step, v)
        except ConfigError:
            raise
        except Exception as e:
            _stopped(cfg, env, run_id, prov, v, e)
        v.status = "ok"
        if measured_device is not None and v.summary is not None:
            v.summary.prediction = _prediction(cfg, env, measured_device, v.summary)
        if env.rank == 0:
            _store_variant(cfg, run_id, prov, v)
    comparisons = _compare_all(results)
    return TrainResult(run_id, encode(cfg), prov, results, comparisons.get("wavefront"), cfg.out_dir, cfg.store,
                       comparisons)


def _stopped(cfg: TrainConfig, env: Env, run_id: str, prov: dict, v: VariantResult, e: Exception) -> None:
    """Record why the variant stopped (what it measured is stored), then raise TrainFailure for the CLI."""
    if isinstance(e, TrainFailure):
        v.status = f"failed: {e}"
    else:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        v.status = f"failed: {type(e).__name__}: {first}"
    if env.rank == 0:
        _store_variant(cfg, run_id, prov, v)
    if isinstance(e, TrainFailure):
        raise e
    at = len(v.steps) + (v.resumed_from_step + 1 if v.resumed_from_step is not None else 0)
    raise TrainFailure(f"rank {env.rank} of {env.world}, {v.variant} step {at}: {v.status[len('failed: '):]}") from e


def _prediction(cfg: TrainConfig, env: Env, device, summary: Summary) -> dict:
    """The planner's step time for this very plan on this machine, and predicted vs measured."""
    try:
        pred = predict.predict(device, build_config(cfg.model), env.layout, world=env.world, seq_len=cfg.seq_len,
                               global_batch=cfg.global_batch, micro_batch=cfg.micro_batch,
                               recompute=cfg.recompute_policy)
    except ValueError as e:  # a plan the planner's model refuses: the run's own KPIs stand
        return {"ok": False, "reasons": [str(e)]}
    return {**pred, "vs_measured": predict.compare(pred, summary)}


def _git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except Exception:
        return None


def _provenance(env: Env) -> dict:
    info = runtime.describe(env.device)
    return {"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "git_sha": _git_sha(),
            "host": platform.node(), "backend": info["backend"], "device_name": info["device_name"],
            "runtime": info, "world_size": env.world, "parallel": env.run.label, "layout": env.run.document,
            "dtype": "bf16" if env.bf16 else "fp32", "torch_threads": torch.get_num_threads()}


def _store_variant(cfg: TrainConfig, run_id: str, prov: dict, v: VariantResult) -> None:
    if cfg.store:
        train_store.write_variant(cfg.store, run_id=run_id, variant=v.variant, status=v.status, provenance=prov,
                                  config=encode(cfg), summary=encode(v.summary),
                                  steps=[asdict(r) for r in v.steps])


def run_order(variants: tuple[str, ...]) -> list[str]:
    """The order the variants run in: as given, except Liger last (its patch also rebinds functions in
    transformers' modeling modules for the rest of the process, which would leak into later variants)."""
    return [v for v in variants if v != "liger"] + [v for v in variants if v == "liger"]


def unavailable(variant: str) -> str | None:
    """Why a variant cannot run in this environment (a missing optional package), or None."""
    if variant == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "Liger-Kernel is not installed (pip install liger-kernel)"
    return None


def _compare_all(results: list[VariantResult]) -> dict[str, dict]:
    """Each measured variant against the first one (the reference), keyed by variant."""
    done = [r for r in results if r.summary]
    if len(done) < 2 or done[0] is not results[0]:
        return {}
    ref = done[0]
    return {r.variant: compare(ref.summary, r.summary, [x.loss for x in ref.steps], [x.loss for x in r.steps])
            for r in done[1:]}


def _broadcast_str(text: str) -> str:
    """Rank 0's string on every rank (the run id must be one id)."""
    box = [text]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(failed: bool) -> None:
    """Tear down the process groups after success (every rank got here: a barrier, then destroy); after a failure
    peers may be gone, so do not wait on them (the caller leaves with os._exit)."""
    if dist.is_initialized() and not failed:
        with contextlib.suppress(Exception):
            dist_launch.destroy_process_group(barrier=True)
