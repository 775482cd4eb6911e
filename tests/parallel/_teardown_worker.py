"""Worker for tests/parallel/test_teardown.py, run under torchrun (gloo, CPU): the teardown path every worker of
this folder shares. Inside `_torchrun.process_group`: an all-reduce on the default group and one on a subgroup,
then the late import that used to keep the default group alive past destroy_process_group (torch._dynamo, FSDP
and torch.distributed._shard import torch.distributed.nn on first use, after init; argv[2] "dynamo" takes that
real path, anything else imports torch.distributed.nn directly, which is what it comes down to and is cheap).
Rank 0 writes the results as JSON to argv[1]; every rank records the c10d threads alive at exit."""

from __future__ import annotations

import importlib
import sys

import torch
import torch.distributed as dist
from _torchrun import process_group, report  # this folder is on sys.path: torchrun runs the worker as a script


def main() -> None:
    late = "torch._dynamo" if len(sys.argv) > 2 and sys.argv[2] == "dynamo" else "torch.distributed.nn"
    with process_group(sys.argv[1]) as (rank, world):
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        pair = dist.new_group([0, 1])  # a subgroup: destroy_process_group() must take it down too
        ones = torch.ones(1)
        dist.all_reduce(ones, group=pair)
        importlib.import_module(late)
        report([{"name": "sums", "world_sum": float(total), "pair_sum": float(ones),
                 "expected_world_sum": world * (world + 1) / 2, "late_import": late}], sys.argv[1])


if __name__ == "__main__":
    main()
