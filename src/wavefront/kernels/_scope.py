"""The op a launch belongs to: a context variable, no Triton, so the op layer imports it at module level.

``op_scope(name)`` labels the launches made inside it (``Launch.op`` in ``wavefront.kernels._launch``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_OP: contextvars.ContextVar[str] = contextvars.ContextVar("wavefront_op", default="")


@contextlib.contextmanager
def op_scope(name: str) -> Iterator[None]:
    """Label launches made inside the block with the op they belong to."""
    token = _OP.set(name)
    try:
        yield
    finally:
        _OP.reset(token)
