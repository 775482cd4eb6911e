"""``wavefront train --fp8 RECIPE``: the FP8 patch of the wavefront variant and its two MFU figures.

The patch is ``wavefront.patch(model, fp8=recipe)`` (docs/fp8.md): every Linear of the decoder becomes a
``Float8Linear`` sharing its Parameters; the LM head stays in bf16. The FP8 op needs its input and weight
in one dtype and autocast does not reach custom ops, so the parameters must be bf16 when the layer runs:

- under FSDP2 (``--parallel fsdp2``, or a mesh with a data-parallel dimension) the MixedPrecisionPolicy's
  bf16 ``param_dtype`` does it and the fp32 master weights stay;
- everywhere else the model's parameters are cast to bf16 (bf16 weights and AdamW states; said in the
  run's notes).

MFU with FP8 layers has two honest denominators, both reported and labelled:

- ``mfu``: every model FLOP against the dense bf16 peak (comparable with a bf16 run's MFU; can exceed
  what bf16 alone could reach);
- ``mfu_fp8``: the swapped layers' FLOPs against the dense FP8 peak, the rest (attention, LM head, kept
  layers) against the bf16 peak: tokens/s x (F_fp8 / P_fp8 + F_rest / P_bf16) / devices, the fraction of
  the time the work would take at the peaks it can use.

F_fp8 per token = 6 x (weights of the swapped layers): 2 per weight forward, 4 backward (dx and dW), the
convention of the model FLOPs (PaLM 6N). A peak measured on a CPU has no FP8 counterpart: ``mfu_fp8`` is
None there unless ``--gpu`` names a device-table row (then both peaks are the row's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Fp8Flops:
    """Model FLOPs per token of the FP8-swapped layers, and the peak they are held against."""

    recipe: str
    flops_per_token: float  # 6 x weights of the swapped layers
    n_layers_swapped: int
    fp8_peak_tflops: float | None
    fp8_peak_source: str


def swapped_flops(model: nn.Module, recipe: str) -> tuple[float, int]:
    """(6 x weights of the model's Float8Linear layers, how many there are); call before sharding."""
    from wavefront.nn.fp8 import Float8Linear

    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    return 6.0 * sum(m.weight.numel() for m in layers), len(layers)


def fp8_peak(device_row, override: float | None) -> tuple[float | None, str]:
    """The dense FP8 peak per device from the device table, or None with the reason."""
    if override is not None and device_row is None:
        return None, "none: --peak-tflops gives one peak; pass --gpu for the table's FP8 and bf16 peaks"
    if device_row is None:
        return None, "none: a measured CPU peak has no FP8 counterpart; pass --gpu for the table's peaks"
    if device_row.fp8_tflops is None:
        return None, f"none: {device_row.name} has no FP8 matrix path"
    return device_row.fp8_tflops, f"device table: {device_row.name} dense fp8"


def mixed_mfu(tokens_per_s: float, model_flops: float, fp8: Fp8Flops, bf16_peak: float | None,
              world_size: int) -> float | None:
    """tokens/s x (F_fp8 / P_fp8 + (F - F_fp8) / P_bf16) / devices; None without both peaks."""
    if not bf16_peak or not fp8.fp8_peak_tflops:
        return None
    ideal_s_per_token = (fp8.flops_per_token / fp8.fp8_peak_tflops
                         + (model_flops - fp8.flops_per_token) / bf16_peak) / 1e12
    return tokens_per_s * ideal_s_per_token / world_size


def needs_bf16_params(plan: str, dp: int) -> bool:
    """True where nothing else gives the FP8 layers bf16 weights (no FSDP2 bf16 param_dtype)."""
    return not (plan == "fsdp2" or (plan == "mesh" and dp > 1))


def cast_params_bf16(model: nn.Module) -> None:
    model.to(torch.bfloat16)


def notes(fp8: Fp8Flops, model_flops: float, cast: bool) -> list[str]:
    share = fp8.flops_per_token / model_flops if model_flops else 0.0
    lines = [f"fp8 {fp8.recipe}: {fp8.n_layers_swapped} Linear layers swapped, {share:.1%} of the model FLOPs; "
             f"MFU = all FLOPs vs the bf16 peak; MFU (fp8 mixed) = those FLOPs vs the FP8 peak "
             f"({fp8.fp8_peak_source}), the rest vs the bf16 peak"]
    if cast:
        lines.append("fp8: parameters cast to bf16 (no FSDP2 param_dtype here): bf16 weights and optimizer states")
    return lines
