"""A detector for host synchronizations made by wavefront code (CPU-testable).

On a GPU, ``.item()``, ``bool(t)``, ``int(t)``, ``float(t)`` and ``.tolist()`` copy a device value to the
host and block until the device is idle; they also break CUDA-graph capture. On the CPU they are free,
so they cannot be observed by timing: this detector wraps those tensor methods and records every call
whose immediate caller lives in the wavefront package (the Triton interpreter's own calls do not exist
on a GPU and are not counted).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

import wavefront

_PACKAGE_DIR = str(Path(wavefront.__file__).parent)
_METHODS = ("item", "__bool__", "__int__", "__float__", "__index__", "tolist")


@contextlib.contextmanager
def host_syncs() -> Iterator[list[str]]:
    """Yield a list that fills with 'file:line method' for each host sync made from wavefront code."""
    calls: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in _METHODS}

    def wrap(name, original):
        def method(self, *args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(_PACKAGE_DIR):
                calls.append(f"{caller.f_code.co_filename}:{caller.f_lineno} {name}")
            return original(self, *args, **kwargs)

        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrap(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
