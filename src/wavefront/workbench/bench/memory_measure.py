"""Measure what autograd keeps for backward, to hold the planner's activation formulas to a real run.

`saved_activation_bytes(fn)` runs `fn` under `torch.autograd.graph.saved_tensors_hooks` and records every
tensor that a backward node saves, counted once per underlying storage (a saved view keeps its whole
storage alive, so the storage's size is what occupies memory) and skipping the storages of the tensors
in `exclude` (the parameters: weights are model states, not activations). This is what the first
activation-memory term of Korthikanti et al. 2022 counts ("the tensors needed for backward"), measured
on whatever device `fn` runs on; on CPU it is exact for the storages autograd sees.

Two things it cannot see, by construction: tensors a custom autograd Function stores as plain ctx
attributes instead of through save_for_backward (wavefront's ops save through save_for_backward), and
tensors kept alive only by a closure, as non-reentrant activation checkpointing does with its inputs.
tests/workbench/planner/test_planner_activation_measured.py compares the measurement with
model.layer_activation_bytes for a GPT layer (Korthikanti Eq. 1) and a Hugging Face Llama layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class SavedTensor:
    shape: tuple[int, ...]
    dtype: str
    storage_bytes: int


@dataclass
class SavedBytes:
    """Bytes of the distinct storages autograd saved while `fn` ran, and what they were."""

    total_bytes: int = 0
    tensors: list[SavedTensor] = field(default_factory=list)
    output: Any = None

    def by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.dtype] = out.get(t.dtype, 0) + t.storage_bytes
        return out


def saved_activation_bytes(fn: Callable[[], Any], *, exclude: Iterable[torch.Tensor] = ()) -> SavedBytes:
    """Run `fn()` and measure the storages its autograd graph saves for backward (module docstring).

    The output of `fn` is kept on the result (`.output`) so the graph, and with it every counted storage,
    stays alive until the caller drops it.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments, got {type(fn).__name__}")
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    result = SavedBytes()
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and ptr not in seen:
            seen.add(ptr)
            nbytes = storage.nbytes()
            result.total_bytes += nbytes
            result.tensors.append(SavedTensor(tuple(t.shape), str(t.dtype).removeprefix("torch."), nbytes))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result.output = fn()
    return result
