"""The norm appliers: family RMSNorm classes and torch.nn.LayerNorm become wavefront.nn modules that
hold the very same ``weight`` (and ``bias``) Parameters, so checkpoints and optimizers see no change.

A module whose class name ends in "Norm" that no rule took is reported as an unknown norm type (for
rms_norm when its name says RMS, else for layer_norm): a model variant with a custom norm is never
silently left half patched.
"""

from __future__ import annotations

import re

from torch import nn

from wavefront.nn import LayerNorm, RMSNorm
from wavefront.patching.patcher import Patcher

_NORM_NAME = re.compile(r"norm$", re.IGNORECASE)


def apply_rms_norm(p: Patcher) -> None:
    rule = p.family.rms_norm
    if rule is None:
        p.absent("rms_norm", f"{p.family.name} models have no RMSNorm")
        return
    found = p.of_classes(rule.classes)
    if not found:
        p.unmatched("rms_norm", f"no module of class {' or '.join(rule.classes)} in this model")
    for path, old in found:
        weight = getattr(old, "weight", None)
        eps = getattr(old, rule.eps_attr, None)
        if not isinstance(weight, nn.Parameter) or weight.dim() != 1:
            p.unmatched("rms_norm", "expected a 1-D 'weight' Parameter", path)
            continue
        if not isinstance(eps, float | int):
            p.unmatched("rms_norm", f"expected a numeric epsilon in attribute '{rule.eps_attr}' (the "
                                    f"transformers class changed shape?)", path)
            continue
        new = RMSNorm(weight.shape[0], float(eps), offset=rule.offset, cast=rule.cast, device="meta")
        new.weight = weight
        p.swap_module("rms_norm", path, new)
    _report_unknown_norms(p, "rms_norm")


def apply_layer_norm(p: Patcher) -> None:
    found = [(path, m) for path, m in p.modules() if type(m) is nn.LayerNorm]
    if not found:
        family = p.family.name if p.family else p.report.model_type
        p.absent("layer_norm", f"{family} models have no LayerNorm")
    for path, old in found:
        if len(old.normalized_shape) != 1:
            p.unmatched("layer_norm", f"normalizes over {len(old.normalized_shape)} dims; the kernel "
                                      f"normalizes the last dim only", path)
            continue
        has_bias = old.bias is not None
        new = LayerNorm(old.normalized_shape, old.eps, elementwise_affine=old.elementwise_affine, bias=has_bias,
                        device="meta")
        if old.elementwise_affine:
            new.weight = old.weight
            new.bias = old.bias
        p.swap_module("layer_norm", path, new)
    _report_unknown_norms(p, "layer_norm")


def _report_unknown_norms(p: Patcher, op: str) -> None:
    """Report norm-like modules of kind `op` that no rule replaced (custom or renamed norm classes): a
    class name saying RMS is an rms_norm, any other "...Norm" a layer_norm."""
    known = tuple(p.family.rms_norm.classes) if p.family and p.family.rms_norm else ()
    known += p.family.left_alone if p.family else ()
    for path, m in p.modules():
        name = type(m).__name__
        if (id(m) in p.replaced or type(m) is nn.LayerNorm or not _NORM_NAME.search(name)
                or type(m).__module__.startswith("wavefront.")):
            continue
        if name in known and type(m).__module__.startswith("transformers."):
            continue
        if ("rms_norm" if "rms" in name.lower() else "layer_norm") == op:
            p.unmatched(op, f"unknown norm type {type(m).__module__}.{name}: no rule for it, so it keeps "
                            f"running its own code", path)
