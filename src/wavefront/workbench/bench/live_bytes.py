"""Peak bytes of live tensors allocated inside a region: a memory meter that works on any device.

``torch.cuda.max_memory_allocated`` exists only on GPUs. This meter is a TorchDispatchMode: every tensor
an op returns inside the region has its storage counted until the storage is freed, so the running sum
is the bytes the region holds live, and its maximum is the region's peak. Liveness is a C++ weak
reference to the storage (Python wrappers die while autograd still holds saved tensors), checked before
each op's outputs are counted: frees between ops are seen before the next allocation, so the peak is
exact at op granularity (temporaries inside one aten kernel are invisible, for every contender alike).

It works on CPU tensors (real runs) and on ``meta`` tensors (shape-only runs: eager's peak at sizes too
large to allocate), and it sees inside wavefront's own custom ops (their Python bodies run with the
meter active), so the chunk buffers of a fused op are counted like anything else.

What is not counted: storages that existed before the region (inputs; views of them), and memory that
is not a torch tensor (Triton interpreter scratch, allocator caching). A storage is counted once however
many views of it exist.

``LargestTensorMeter`` answers a narrower question: the largest single tensor any op returns in the region
(a DTensor counts its local shard), whatever is live beside it; e.g. "no op materializes more than one rank's
shard of the logits".

The Triton interpreter leaves reference cycles that keep a launch's tensor arguments alive until the
garbage collector runs (a compiled launch holds no references); ``collect_after_wavefront_ops`` (on by
default) runs the collector after each wavefront op so that artifact does not inflate the peak.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class LiveBytes:
    """The result: bytes live at the peak and at the end of the region (both exclude inputs)."""

    peak_bytes: int = 0
    live_bytes: int = 0
    n_allocations: int = 0
    biggest: list[tuple[int, str]] = field(default_factory=list)  # (bytes, op) of the largest allocations

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20


class LiveBytesMeter(TorchDispatchMode):
    """``with LiveBytesMeter() as meter: ...`` then ``meter.result``."""

    def __init__(self, keep_biggest: int = 8, collect_after_wavefront_ops: bool = True):
        super().__init__()
        self._collect = collect_after_wavefront_ops
        self.result = LiveBytes()
        self._counted: dict[int, tuple[StorageWeakRef, int]] = {}
        self._external: dict[int, StorageWeakRef] = {}
        self._keep = keep_biggest

    def _sweep(self) -> None:
        for key, (ref, nbytes) in list(self._counted.items()):
            if ref.expired():
                del self._counted[key]
                self.result.live_bytes -= nbytes
        for key, ref in list(self._external.items()):
            if ref.expired():
                del self._external[key]

    def _note_inputs(self, args) -> None:
        for t in tree_flatten(args)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self._counted and key not in self._external:
                    self._external[key] = StorageWeakRef(storage)

    def _count_outputs(self, out, op_name: str) -> None:
        self._sweep()
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self._counted or key in self._external:
                continue
            nbytes = storage.nbytes()
            self._counted[key] = (StorageWeakRef(storage), nbytes)
            r = self.result
            r.live_bytes += nbytes
            r.n_allocations += 1
            r.peak_bytes = max(r.peak_bytes, r.live_bytes)
            r.biggest = sorted([*r.biggest, (nbytes, op_name)], reverse=True)[: self._keep]

    def __exit__(self, *exc):
        self._sweep()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._note_inputs((args, kwargs))
        if func.namespace == "wavefront" and _all_cpu((args, kwargs)):
            # Run the op's own CPU body with the meter still active, so its internal buffers count.
            with self:
                out = func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
            if self._collect:
                gc.collect()
        else:
            out = func(*args, **kwargs)
        self._count_outputs(out, str(func))
        return out


class LargestTensorMeter(TorchDispatchMode):
    """``with LargestTensorMeter() as meter: ...`` then ``meter.max_bytes``: the bytes of the largest tensor any op
    returned while active (the Triton interpreter's copies included; a DTensor counts its local shard)."""

    def __init__(self):
        super().__init__()
        self.max_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor  # lazy: torch submodule on use

        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, DTensor):
                t = t._local_tensor
            if isinstance(t, torch.Tensor):
                self.max_bytes = max(self.max_bytes, t.numel() * t.element_size())
        return out


def _all_cpu(tree) -> bool:
    tensors = [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)
