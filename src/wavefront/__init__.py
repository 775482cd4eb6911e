"""wavefront: fused Triton kernels for transformer training, and the workbench that proves their speed.

Importing the package has no side effects and imports neither torch nor Triton; the submodules load on
first use: ``wavefront.ops``, ``wavefront.nn``, ``wavefront.optim``, ``wavefront.runtime``,
``wavefront.workbench``, ``wavefront.memcheck`` (bounds checks for interpreted kernels,
``wavefront.MemcheckError``); ``wavefront.patch`` / ``wavefront.unpatch`` for Hugging Face models.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = {"ops", "nn", "optim", "runtime", "reference", "shapes", "workbench", "patching", "kernels", "memcheck"}
_LAZY_ATTRS = {"patch": "wavefront.patching", "unpatch": "wavefront.patching", "PatchReport": "wavefront.patching",
               "MemcheckError": "wavefront.kernels._memcheck"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"wavefront.{name}")
    if name in _LAZY_ATTRS:
        return getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
    raise AttributeError(f"module 'wavefront' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_SUBMODULES, *_LAZY_ATTRS])
