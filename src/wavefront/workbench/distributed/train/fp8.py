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

``--fp8-all-gather``: FSDP2 all-gathers the FP8 weights (``wavefront.parallel.fp8_fsdp``: each rank quantizes
its shard, half the bytes of bf16), wrapped after the patch and the move to the device, before fully_shard.
FSDP2 only: ``--parallel fsdp2`` or a mesh whose only sharding is dp_shard > 1 (no TP/PP/HSDP, whose
parameters are DTensors over other mesh dimensions first); no EP; no checkpoints (the wrapped sharded weights
are not a DCP-tested layout yet); ``--reshard-after-forward`` true or false (an int re-gathers on a smaller
mesh, which torch's FSDP2 does not offer to all-gather extensions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from wavefront.nn.fp8 import Float8Linear
from wavefront.parallel.fp8_fsdp import RECIPES as GATHERED
from wavefront.parallel.fp8_fsdp import enable_fp8_all_gather
from wavefront.workbench.distributed.train.mesh import Layout


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


def needs_bf16_params(layout: Layout) -> bool:
    """True where nothing else gives the FP8 layers bf16 weights (no FSDP2 bf16 param_dtype)."""
    return not layout.shards


def cast_params_bf16(model: nn.Module) -> None:
    model.to(torch.bfloat16)


def all_gather_problem(cfg, layout: Layout) -> str | None:
    """Why ``--fp8-all-gather`` cannot run with these options on the run's resolved `layout` (a one-line error),
    or None."""
    if not cfg.fp8_all_gather:
        return None
    if cfg.fp8 is None:
        return "--fp8-all-gather gathers the weights of the FP8 layers: pass --fp8 RECIPE too"
    if cfg.fp8 not in GATHERED:
        return f"--fp8-all-gather: recipe {cfg.fp8} has no FP8 all-gather (supported: {', '.join(GATHERED)})"
    if layout.tp > 1 or layout.pp > 1 or layout.dp_replicate > 1 or layout.dp_shard < 2:
        return (f"--fp8-all-gather is an FSDP2 option and needs FSDP2 sharding only (--dp-shard >= 2, or --parallel "
                f"fsdp2), not TP, PP, HSDP replicas or DDP; this run's layout: {layout.label()}")
    if cfg.ep > 1:
        return "--fp8-all-gather with --ep is not supported"
    if cfg.checkpoint_dir:
        return "--fp8-all-gather: checkpoints of FP8-gathered weights are not supported yet; drop --checkpoint-dir"
    if not isinstance(cfg.reshard_after_forward, bool):
        return ("--fp8-all-gather: --reshard-after-forward must be true or false (FSDP2 has no all-gather extension "
                "for a smaller re-gather mesh)")
    return None


def enable_all_gather(model: nn.Module, shard_degree: int) -> list[str]:
    """Wrap the model's Float8Linear weights for the FP8 all-gather; the run's notes on what was wrapped."""
    report = enable_fp8_all_gather(model, shard_degree, marked_only=False)
    lines = [f"fp8 all-gather: {len(report.wrapped)} weights gathered in FP8 over {shard_degree} FSDP2 ranks (half "
             f"the bytes of bf16, plus the scales)"]
    lines += [f"fp8 all-gather: {name} gathered in bf16: {why}" for name, why in report.skipped.items()]
    return lines


def notes(fp8: Fp8Flops, model_flops: float, cast: bool) -> list[str]:
    share = fp8.flops_per_token / model_flops if model_flops else 0.0
    lines = [f"fp8 {fp8.recipe}: {fp8.n_layers_swapped} Linear layers swapped, {share:.1%} of the model FLOPs; "
             f"MFU = all FLOPs vs the bf16 peak; MFU (fp8 mixed) = those FLOPs vs the FP8 peak "
             f"({fp8.fp8_peak_source}), the rest vs the bf16 peak"]
    if cast:
        lines.append("fp8: parameters cast to bf16 (no FSDP2 param_dtype here): bf16 weights and optimizer states")
    return lines
