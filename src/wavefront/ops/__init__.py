"""wavefront's ops: the functional API and the op registry.

``REGISTRY`` maps each op's name to its :class:`~wavefront.ops._spec.OpSpec`. It is an explicit dict (no
discovery): an op joins every tool (tests, bench, inspect, traffic, roofline, gates, report) by adding
its module's ``SPECS`` here.
"""

from __future__ import annotations

from wavefront.ops import attention as _attention
from wavefront.ops import linear as _linear
from wavefront.ops import norm as _norm
from wavefront.ops import softmax as _softmax
from wavefront.ops._spec import Case, OpInputs, OpSpec, Tolerance
from wavefront.ops.attention import attention
from wavefront.ops.linear import linear
from wavefront.ops.norm import add_rms_norm, layer_norm, rms_norm
from wavefront.ops.softmax import softmax

REGISTRY: dict[str, OpSpec] = {spec.name: spec for spec in (*_norm.SPECS, *_softmax.SPECS, *_attention.SPECS,
                                                             *_linear.SPECS)}


def get_spec(name: str) -> OpSpec:
    """The registered op called `name`; an unknown name lists the registered ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}") from None


__all__ = ["REGISTRY", "Case", "OpInputs", "OpSpec", "Tolerance", "add_rms_norm", "attention", "get_spec",
           "layer_norm", "linear", "rms_norm", "softmax"]
