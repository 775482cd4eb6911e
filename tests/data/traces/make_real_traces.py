"""Regenerate the real CPU traces in this folder with torch.profiler (run from the repository root):

    python tests/data/traces/make_real_traces.py

- cpu_train_h64.json.gz / cpu_train_h512.json.gz: a small MLP training loop (AdamW), 8 profiled steps,
  hidden width 64 and 512 (the pair the diff tests compare: the wider one is slower in every step);
- gloo_rank0.json.gz / gloo_rank1.json.gz: the same loop under DistributedDataParallel on 2 ranks
  with the gloo backend (torch.multiprocessing), so collective events exist, 6 profiled steps.

Recorded with record_shapes=True on the CPU (no GPU here): the traces have no device events.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

HERE = Path(__file__).resolve().parent


def _model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.GELU(), nn.Linear(hidden, 64), nn.LayerNorm(64))


def _loop(model: nn.Module, out: Path, steps: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    raw = out.with_suffix("")  # drop .gz

    def save(prof):
        prof.export_chrome_trace(str(raw))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=steps), on_trace_ready=save) as prof:
        for _ in range(steps + 1):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    with open(raw, "rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def _rank(rank: int, world: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "29561"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    _loop(nn.parallel.DistributedDataParallel(_model(128)), HERE / f"gloo_rank{rank}.json.gz", 6)
    dist.destroy_process_group()


def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for hidden in (64, 512):
        _loop(_model(hidden), HERE / f"cpu_train_h{hidden}.json.gz", 20)
    mp.spawn(_rank, args=(2,), nprocs=2)
    for f in sorted(HERE.glob("*.json.gz")):
        print(f"{f.name}: {f.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
