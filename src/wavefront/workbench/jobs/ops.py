"""Request fields that name registered ops, dtypes and compile targets (the kernel-side jobs: inspect,
traffic, roofline, bench, gate). Imports the registry and torch, unlike :mod:`.request`."""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from wavefront import runtime
from wavefront.ops import REGISTRY
from wavefront.workbench.jobs.request import DTYPES, RequestError


def torch_dtype(name: str) -> torch.dtype:
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in table:
        raise RequestError("dtype", f"must be one of {', '.join(DTYPES)}; got {name!r}")
    return table[name]


def check_ops(ops: Iterable[str] | None, argument: str = "op") -> tuple[str, ...]:
    for name in ops or ():
        if name not in REGISTRY:
            raise RequestError(argument, f"unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    return tuple(ops or ())


def check_targets(targets: Iterable[str], argument: str = "targets") -> tuple[str, ...]:
    out = tuple(t.strip() for t in targets if t.strip())
    if not out:
        raise RequestError(argument, "give at least one target")
    for t in out:
        if t not in runtime.ARCHS or runtime.ARCHS[t].family == "cpu":
            raise RequestError(argument, f"unknown target {t!r}; choose from {', '.join(runtime.DEFAULT_TARGETS)}")
    return out


def split_targets(text: str, argument: str = "targets") -> tuple[str, ...]:
    """A comma-separated target list ('none' or '' for no target)."""
    if text.strip().lower() in ("", "none"):
        return ()
    return check_targets(text.split(","), argument)


def use_interpreter() -> None:
    """Traffic is counted under the interpreter, also on a GPU machine: turn it on before any kernel module
    is imported (kernel modules load lazily, on an op's first call)."""
    if not runtime.interpreting():
        os.environ["TRITON_INTERPRET"] = "1"
