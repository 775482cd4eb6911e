"""The trace readers' error, in a module of its own: the JSON loader dispatches to the vendor readers
(nsys, rocprof), which raise it too."""

from __future__ import annotations


class TraceLoadError(ValueError):
    """The file is not a readable trace at all (no events could be recovered)."""
