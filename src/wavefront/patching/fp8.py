"""The FP8 option of :func:`wavefront.patch`: swap a model's ``torch.nn.Linear`` layers for
:class:`wavefront.nn.Float8Linear`, keeping the layers the recipe leaves in high precision.

    wavefront.patch(model, fp8="rowwise")                                  # the recipe's defaults
    wavefront.patch(model, fp8=Fp8Config("blockwise", keep_first_last=True))

Which layers stay in the model's dtype, and why (docs/fp8.md cites the sources):

- ``keep_lm_head`` (default True): the output projection. DeepSeek-V3 keeps its output head in its
  original precision; torchao's float8 training guide filters it out with ``module_filter_fn``. Its
  logits feed a softmax over the vocabulary, where FP8's ~6% relative error per element is not averaged
  away, and the fused loss (``loss=True``) reads its weight directly, so an FP8 head would not even run.
- ``keep_first_last`` (default False): the Linear layers of the first and last decoder layers, the
  Megatron-LM / Transformer Engine option (``--first-last-layers-bf16``) for runs that diverge in FP8.
- MoE routers (a Linear named ``gate`` or ``router``) always: DeepSeek-V3 keeps its MoE gating in
  high precision (top-k selection is sensitive to small logit changes). Expert weights held as grouped
  Parameters (wavefront.nn.MoEExperts, transformers' fused experts) are not Linear layers and stay as
  they are.
- ``keep_attention`` (default False): q/k/v/o projections (``self_attn``). DeepSeek-V3 keeps the
  attention *operator* (softmax(QK^T)V) in bf16, which wavefront never runs in FP8; the projections are
  FP8 in every published recipe, so this is an opt-in for ablations.

``fp8_all_gather=True`` marks the swapped layers for FSDP2's FP8 weight all-gather: call
``wavefront.parallel.enable_fp8_all_gather(model, shard_degree)`` before ``fully_shard`` (docs/fp8.md).

Each swap reuses the layer's Parameters (state_dict unchanged, optimizer state kept), is listed in the
report (op "fp8"), and is undone by ``wavefront.unpatch`` like every other swap. Layers kept in high
precision are listed in the report's "absent" entries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from wavefront.patching.patcher import Patcher

RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8")
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_ROUTER_NAMES = ("gate", "router")  # MoE routers (Mixtral, Qwen-MoE, DeepSeek); gate_proj is the MLP's


@dataclass(frozen=True)
class Fp8Config:
    recipe: str = "rowwise"
    keep_lm_head: bool = True
    keep_first_last: bool = False
    keep_attention: bool = False
    fnuz: bool | None = None  # None: FNUZ formats on gfx942 (MI300), OCP elsewhere
    provider: str = "auto"
    fp8_all_gather: bool = False  # mark the layers for FSDP2's FP8 weight all-gather (wavefront.parallel.fp8_fsdp)

    def __post_init__(self):
        if self.recipe not in RECIPES:
            raise ValueError(f"wavefront.patch: fp8 recipe must be one of {RECIPES}, got {self.recipe!r}")


def resolve(fp8) -> Fp8Config | None:
    """The patch's ``fp8=`` argument as a config: None, a recipe name, or an :class:`Fp8Config`."""
    if fp8 is None or isinstance(fp8, Fp8Config):
        return fp8
    if isinstance(fp8, str):
        return Fp8Config(fp8)
    raise TypeError(f"wavefront.patch: 'fp8' must be None, one of {RECIPES} or an Fp8Config, got {fp8!r}")


def apply_fp8(p: Patcher, cfg: Fp8Config) -> None:
    from wavefront.nn.fp8 import Float8Linear

    if p.family is None:
        model_type = getattr(getattr(p.model, "config", None), "model_type", None)
        p.unmatched("fp8", f"wavefront has no rules for model_type {model_type!r} (FP8 swaps the "
                           f"Linear layers of the dense families only)")
        return
    get_head = getattr(p.model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    linears = [(path, m) for path, m in p.modules() if type(m) is nn.Linear]
    layer_ids = [int(m.group(1)) for path, _ in linears if (m := _LAYER.search(f".{path}."))]
    edge = {min(layer_ids), max(layer_ids)} if layer_ids and cfg.keep_first_last else set()
    kept, swapped = [], 0
    if not cfg.keep_lm_head and p.report.counts().get("loss"):
        p.unmatched("fp8", "keep_lm_head=False with the fused loss (loss=True), which reads the LM head's weight "
                           "directly: an FP8 head would never run; pass loss=False or keep the head")
    for path, lin in linears:
        layer = _LAYER.search(f".{path}.")
        if lin is head and cfg.keep_lm_head:
            kept.append(path)
            continue
        if ((layer and int(layer.group(1)) in edge) or (cfg.keep_attention and ".self_attn." in f".{path}.")
                or path.rpartition(".")[2] in _ROUTER_NAMES):
            kept.append(path)
            continue
        p.swap_module("fp8", path, Float8Linear.from_linear(lin, recipe=cfg.recipe, fnuz=cfg.fnuz,
                                                            provider=cfg.provider,
                                                            fp8_all_gather=cfg.fp8_all_gather))
        swapped += 1
    if kept:
        p.absent("fp8", f"kept in high precision by the {cfg.recipe} recipe's options: {', '.join(kept)}")
    if not swapped and not p.report.unmatched:
        p.unmatched("fp8", "no torch.nn.Linear layer to swap in this model")
