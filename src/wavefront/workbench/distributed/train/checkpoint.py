"""Checkpoint save and resume with torch.distributed.checkpoint (DCP).

Layout under ``--checkpoint-dir``::

    step_000004/        DCP shards: model and optimizer state (sharded as trained: DDP or FSDP2)
    step_000004.json    what the harness needs to continue: step, loss history, config essentials
    latest              the name of the newest complete checkpoint, replaced atomically

``latest`` is written by rank 0 only after every rank finished its shards (a barrier), so a run killed
mid-save resumes from the previous complete checkpoint. The data position is a function of the step
(train_data.Batches), so resuming at step N replays exactly the batches of an uninterrupted run. The two
newest checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch.distributed as dist

KEEP = 2


def _name(step: int) -> str:
    return f"step_{step:06d}"


def save(ckpt_dir: str | Path, step: int, model, optimizer, meta: dict) -> Path:
    """Save after `step` completed (resume starts at step + 1). Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(ckpt_dir)
    path = root / _name(step)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        (root / f"{_name(step)}.json").write_text(json.dumps({**meta, "step": step}, indent=1))
        tmp = root / "latest.tmp"
        tmp.write_text(_name(step))
        os.replace(tmp, root / "latest")
        done = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in done[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
            (root / f"{old.name}.json").unlink(missing_ok=True)
    dist.barrier()
    return path


def latest(ckpt_dir: str | Path) -> dict | None:
    """Metadata of the newest complete checkpoint, or None."""
    root = Path(ckpt_dir)
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    meta = json.loads((root / f"{name}.json").read_text())
    meta["path"] = str(root / name)
    return meta


def load(meta: dict, model, optimizer) -> None:
    """Load a checkpoint found by :func:`latest` into the (already wrapped) model and optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=meta["path"])
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
