"""wavefront's ops: the functional API and the op registry.

``REGISTRY`` maps each op's name to its :class:`~wavefront.ops._spec.OpSpec`. It is an explicit dict (no
discovery): an op joins every tool (tests, bench, inspect, traffic, roofline, gates, report) by adding
its module's ``SPECS`` here.
"""

from __future__ import annotations

from wavefront.ops import adamw as _adamw
from wavefront.ops import attention as _attention
from wavefront.ops import cross_entropy as _cross_entropy
from wavefront.ops import glu as _glu
from wavefront.ops import grouped_linear as _grouped_linear
from wavefront.ops import linear as _linear
from wavefront.ops import linear_cross_entropy as _linear_cross_entropy
from wavefront.ops import linear_fp8 as _linear_fp8
from wavefront.ops import moe as _moe
from wavefront.ops import norm as _norm
from wavefront.ops import quantize as _quantize
from wavefront.ops import rope as _rope
from wavefront.ops import softmax as _softmax
from wavefront.ops._spec import Case, OpInputs, OpSpec, Tolerance
from wavefront.ops.adamw import adamw_step
from wavefront.ops.attention import attention
from wavefront.ops.cross_entropy import LossOutput, cross_entropy
from wavefront.ops.glu import geglu, swiglu
from wavefront.ops.grouped_linear import grouped_linear
from wavefront.ops.linear import linear
from wavefront.ops.linear_cross_entropy import linear_cross_entropy
from wavefront.ops.linear_fp8 import Quantized, linear_fp8
from wavefront.ops.moe import moe_permute, moe_router, moe_unpermute
from wavefront.ops.norm import add_rms_norm, layer_norm, rms_norm
from wavefront.ops.quantize import quantize
from wavefront.ops.rope import rope
from wavefront.ops.softmax import softmax

REGISTRY: dict[str, OpSpec] = {
    spec.name: spec
    for module in (_norm, _softmax, _cross_entropy, _linear_cross_entropy, _glu, _rope, _adamw, _attention, _linear,
                   _moe, _grouped_linear, _quantize, _linear_fp8)
    for spec in module.SPECS
}


def get_spec(name: str) -> OpSpec:
    """The registered op called `name`; an unknown name lists the registered ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}") from None


__all__ = ["REGISTRY", "Case", "LossOutput", "OpInputs", "OpSpec", "Quantized", "Tolerance", "adamw_step",
           "add_rms_norm", "attention", "cross_entropy", "geglu", "get_spec", "grouped_linear", "layer_norm", "linear",
           "linear_cross_entropy", "linear_fp8", "moe_permute", "moe_router", "moe_unpermute", "quantize", "rms_norm",
           "rope", "softmax", "swiglu"]
