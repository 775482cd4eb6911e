"""Checkpoint save and resume with torch.distributed.checkpoint (DCP).

Layout under ``--checkpoint-dir``::

    step_000004/        DCP shards: model and optimizer state (sharded as trained: DDP or FSDP2)
    step_000004.json    what the harness needs to continue: step, loss history, config essentials
    latest              the name of the newest complete checkpoint, replaced atomically

``latest`` is written by rank 0 only after every rank finished its shards (a barrier), so a run killed
mid-save resumes from the previous complete checkpoint. The data position is a function of the step
(train_data.Batches), so resuming at step N replays exactly the batches of an uninterrupted run. The two
newest checkpoints are kept.

``--resume`` continues from the newest *intact* checkpoint (:func:`resume_point`): one whose metadata or a
shard is missing (a disk cleaned by hand, a copy cut short) is skipped with a note, and with no checkpoint
at all the run says so and starts at step 0.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from wavefront.workbench.distributed.train.expert_parallel import full_optim_state, local_optim_state

KEEP = 2


def _name(step: int) -> str:
    return f"step_{step:06d}"


def save(ckpt_dir: str | Path, step: int, model, optimizer, meta: dict, ep=None) -> Path:
    """Save after `step` completed (resume starts at step + 1). Collective: every rank calls it. ep: the
    run's expert-parallel state (expert weights and their optimizer states are stored full, (E, ...))."""
    import torch.distributed.checkpoint as dcp  # lazy: torch submodule on use
    from torch.distributed.checkpoint.state_dict import get_state_dict  # lazy: torch submodule on use


    root = Path(ckpt_dir)
    path = root / _name(step)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    optim_sd = full_optim_state(optim_sd, ep)
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


def _missing(path: Path) -> str | None:
    """None when the DCP checkpoint at `path` has its metadata and every shard it names; else what lacks."""
    if not path.is_dir():
        return "its directory is missing"
    if not (path / ".metadata").is_file():
        return "it has no .metadata"
    try:
        from torch.distributed.checkpoint import FileSystemReader  # lazy: torch submodule on use

        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as exc:
        return f"its .metadata cannot be read ({type(exc).__name__})"
    names = sorted({info.relative_path for info in (metadata.storage_data or {}).values()})
    lacking = [n for n in names if not (path / n).is_file()]
    return f"shard {lacking[0]} is missing" if lacking else None


@dataclass
class ResumePoint:
    """Where ``--resume`` continues: the newest intact checkpoint's metadata (None: start at step 0) and
    a note saying what was skipped or that nothing was found."""

    meta: dict | None
    note: str | None


def resume_point(ckpt_dir: str | Path) -> ResumePoint:
    """The newest *intact* checkpoint under `ckpt_dir`: the one ``latest`` names, else older ones newest
    first; a checkpoint with a missing shard or metadata is skipped and the note says so."""
    root = Path(ckpt_dir)
    pointer = root / "latest"
    names = [pointer.read_text().strip()] if pointer.is_file() else []
    names += sorted((p.stem for p in root.glob("step_*.json")), reverse=True)
    skipped: list[str] = []
    for name in dict.fromkeys(names):
        meta_file = root / f"{name}.json"
        why = _missing(root / name) if meta_file.is_file() else "its .json is missing"
        if why is None:
            meta = json.loads(meta_file.read_text())
            meta["path"] = str(root / name)
            note = None
            if skipped:
                note = (f"--resume: skipped {'; '.join(skipped)}; resuming from the last intact checkpoint "
                        f"{name} (after step {meta['step']})")
            return ResumePoint(meta, note)
        skipped.append(f"{name} ({why})")
    if skipped:
        return ResumePoint(None, f"--resume: no intact checkpoint under {root} ({'; '.join(skipped)}); "
                                 f"starting at step 0")
    return ResumePoint(None, f"--resume: no checkpoint under {root} yet; starting at step 0")


def load(meta: dict, model, optimizer, ep=None) -> None:
    """Load a checkpoint found by :func:`resume_point` into the (already wrapped) model and optimizer."""
    import torch.distributed.checkpoint as dcp  # lazy: torch submodule on use
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # lazy: torch submodule on use


    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": full_optim_state(optim_sd, ep, gather=False)}
    dcp.load(state, checkpoint_id=meta["path"])
    state["optim"] = local_optim_state(state["optim"], ep)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
