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

``fused_producers`` (default True): each linear input is quantized once, in the op that produces it
(:class:`wavefront.nn.fp8.Fp8HandOff`): ``input_layernorm`` for q/k/v_proj and ``post_attention_layernorm``
for gate/up_proj (every recipe but tensorwise), the SwiGLU/GeGLU output for down_proj and the attention
output for o_proj (blockwise and mxfp8: their 1x128 / 1x32 groups stay inside one program's row block or
head; a rowwise scale needs the amax over programs). Each hand-off is in ``report.handoffs``; where one
cannot be made the report's "absent" entries say why. The results are bit-identical either way.

Each swap reuses the layer's Parameters (state_dict unchanged, optimizer state kept), is listed in the
report (op "fp8"), and is undone by ``wavefront.unpatch`` like every other swap. Layers kept in high
precision are listed in the report's "absent" entries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from wavefront.nn import LayerNorm, RMSNorm
from wavefront.nn.fp8 import HANDOFF_ATTR, Float8Linear, Fp8HandOff
from wavefront.patching.attention import IMPLEMENTATION
from wavefront.patching.mlp import FusedGateUpMLP, GatedMLP
from wavefront.patching.patcher import Patcher
from wavefront.patching.report import HandOff

RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8")
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_ROUTER_NAMES = ("gate", "router")  # MoE routers (Mixtral, Qwen-MoE, DeepSeek); gate_proj is the MLP's
_DECODER_LAYER = re.compile(r"(?:^|\.)layers\.\d+$")
#: Output scale groups the gated activation and attention can fuse (a group inside one program's row
#: block or head); a rowwise scale needs the amax of a row spread over several programs.
_BLOCK_GROUP = {"block1x128": 128, "block1x32": 32}


@dataclass(frozen=True)
class Fp8Config:
    recipe: str = "rowwise"
    keep_lm_head: bool = True
    keep_first_last: bool = False
    keep_attention: bool = False
    fnuz: bool | None = None  # None: FNUZ formats on gfx942 (MI300), OCP elsewhere
    provider: str = "auto"
    fp8_all_gather: bool = False  # mark the layers for FSDP2's FP8 weight all-gather (wavefront.parallel.fp8_fsdp)
    fused_producers: bool = True  # quantize each linear input in its producer's kernel (bit-identical)

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
    if cfg.fused_producers and swapped:
        link_producers(p, cfg)


def _why_not_fused(p: Patcher, kind: str, producer: nn.Module, scaling: str) -> str | None:
    """Why `producer` cannot emit the recipe's activation copy; None when it can."""
    if kind == "norm":
        return None if isinstance(producer, RMSNorm | LayerNorm) else "the norm is not wavefront's (rms_norm=False)"
    if scaling not in _BLOCK_GROUP:
        what = "the gated activation's" if kind == "gated" else "attention's"
        return (f"{scaling} scales: {what} output row spans several programs, so a row's amax needs a "
                f"cross-program reduction and a second pass over the output (what the fusion saves)")
    if kind == "gated":
        return None if isinstance(producer, GatedMLP | FusedGateUpMLP) else "the MLP is not patched (mlp=False)"

    if getattr(p.model.config, "_attn_implementation", None) != IMPLEMENTATION:
        return "the model's own attention function runs (attention=False)"
    head_dim = getattr(producer, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim % _BLOCK_GROUP[scaling]:
        return f"head_dim {head_dim} is not a multiple of the {scaling} group (a group must stay in one head)"
    return None


def link_producers(p: Patcher, cfg: Fp8Config) -> None:
    """Link each family producer to the Float8Linear layers it feeds (Fp8Config.fused_producers)."""
    if cfg.recipe == "tensorwise":
        p.absent("fp8", "fused producers: none under tensorwise (its one scale needs the whole tensor's amax "
                        "before any element is quantized: a second pass over the output)")
        return
    if not p.family.fp8_producers:
        p.absent("fp8", f"fused producers: the {p.family.name} rules name none (Family.fp8_producers); each FP8 "
                        f"linear quantizes its own input")
        return
    scaling = Fp8HandOff(cfg.recipe, cfg.fnuz, ()).scaling
    not_fused: dict[str, list[str]] = {}
    modules = dict(p.modules())
    for base in [path for path in modules if _DECODER_LAYER.search(path)]:
        for rule in p.family.fp8_producers:
            producer = modules.get(f"{base}.{rule.producer}")
            consumers = [(f"{base}.{c}", modules.get(f"{base}.{c}")) for c in rule.consumers]
            consumers = [(path, m) for path, m in consumers
                         if isinstance(m, Float8Linear) and m.recipe == cfg.recipe and m.fnuz == cfg.fnuz]
            if producer is None or not consumers:
                continue
            why = _why_not_fused(p, rule.kind, producer, scaling)
            if why is not None:
                not_fused.setdefault(why, []).append(", ".join(path for path, _ in consumers))
                continue
            handoff = Fp8HandOff(cfg.recipe, cfg.fnuz, tuple(m for _, m in consumers))
            p.set_attr(f"{base}.{rule.producer}", HANDOFF_ATTR, handoff)
            for path, _ in consumers:
                p.set_attr(path, "fp8_source", handoff)
            p.report.handoffs.append(HandOff(f"{base}.{rule.producer}", tuple(path for path, _ in consumers),
                                             scaling))
    for why, paths in not_fused.items():
        p.absent("fp8", f"not fused into their producer ({why}); they quantize their input themselves: "
                        f"{'; '.join(paths)}")
