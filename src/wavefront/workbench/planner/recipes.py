"""What a published run's recipe states beyond its table: the MoE dispatcher, the EP all-to-all overlap and
the recompute modules of Megatron-Bridge's performance configs, looked up by the plan a table row ran.

A Megatron-Bridge performance table prints the plan (GPUs, GBS, MBS, TP, PP, VP, EP) but not how the
tokens travel. Its configs do (`scripts/performance/configs/{qwen,deepseek}/*_workload_base_configs.py`):
`moe_token_dispatcher_type="alltoall"`, or the flex dispatcher with `moe_flex_dispatcher_backend`
"deepep" / "hybridep", `moe_a2a_overlap` and `recompute_modules`. A row takes the facts of the config
whose plan equals its own, field for field; a row no config matches takes none (the table's defaults
stand). The configs were
read at NVIDIA-NeMo/Megatron-Bridge commits 01b2977 (Qwen3) and 0426418 (DeepSeek-V3), which hold the
"V1" presets (the 25.x global batches) and the "V2" presets (26.x); a release's own copy may differ,
which is why a plan must match exactly before a fact is taken. Where configs of one plan differ by
precision (DeepSeek-V3 on GB200: FP8-CS recomputes the dense MLPs, BF16 and MXFP8 the MLA up-projections,
MXFP8 alone overlaps the all-to-alls), the config names its precisions and a row must state its own
(`recipe_precision`: "bf16", "fp8_cs" or "fp8_mx"); a row that matches configs with different facts and
states none takes none.

How the planner prices the facts (Training): "deepep" and "hybridep" send a token once to each node that
holds one of its experts (ep_dispatch "deepep": both dedupe across nodes, HybridEP with a hierarchical
intra-node stage); "alltoall" sends every copy (ep_dispatch "all-to-all"); moe_a2a_overlap True overlaps
the all-to-alls with another micro-batch's compute (ep_overlap 1, bounded by that compute:
time.ep_comm_per_layer_s); `recompute_modules` makes the plan's recompute "selective" with those modules
(Training.recompute_modules). CUDA-graph scopes are kept for the record, not priced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Recipe:
    """One performance config: its plan and the MoE facts it states."""

    config: str
    gpu: str
    model: str
    n_gpus: int
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    vpp: int
    ep: int
    dispatcher: str  # "alltoall", "deepep" or "hybridep"
    a2a_overlap: bool
    recompute_modules: tuple[str, ...] = ()  # recompute_modules (granularity selective); () none
    unpriced: str = ""  # stated facts the planner does not price
    precisions: tuple[str, ...] = ()  # the precision variants it is ("bf16", "fp8_cs", "fp8_mx"); (): any

    def plan(self) -> tuple[Any, ...]:
        return (self.gpu, self.model, self.n_gpus, self.global_batch, self.micro_batch, self.tp, self.pp,
                self.vpp, self.ep)

    def facts(self) -> dict[str, Any]:
        """The row settings it states: the stack's (ep_dispatch, ep_overlap) and the plan's checkpointing
        (recompute "selective" with its modules, when the config names any)."""
        out: dict[str, Any] = {"ep_dispatch": "all-to-all" if self.dispatcher == "alltoall" else "deepep",
                               "ep_overlap": 1.0 if self.a2a_overlap else 0.0}
        if self.recompute_modules:
            out |= {"recompute": "selective", "recompute_modules": self.recompute_modules}
        return out


_QWEN = "qwen3_workload_base_configs.py (commit 01b2977)"
_DSV3 = "deepseek_workload_base_configs.py (commit 0426418)"
_GRAPHS = "CUDA graphs: attn, moe_router, moe_preprocess"
_MX_DSV3 = "full-iteration CUDA graph; CuTe DSL fused grouped MLP"

#: The H100 and B200 MoE configs of Megatron-Bridge's performance scripts (the module docstring).
MEGATRON_BRIDGE: tuple[Recipe, ...] = (
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1, {_QWEN}", "h100", "qwen3-235b-a22b", 256, 2048, 1, 2, 8,
           4, 32, "alltoall", True),
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2, {_QWEN}", "h100", "qwen3-235b-a22b", 256, 8192, 1, 2, 8,
           4, 32, "alltoall", True),
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_B200_FP8_CS_V1, {_QWEN}", "b200", "qwen3-235b-a22b", 64, 1024, 1, 1, 8,
           1, 8, "alltoall", False),
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_B200_FP8_CS_V2, {_QWEN}", "b200", "qwen3-235b-a22b", 256, 8192, 1, 1, 8,
           1, 8, "alltoall", False),
    Recipe(f"QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_BF16_V1 (= FP8_CS, FP8_MX), {_QWEN}", "b200", "qwen3-30b-a3b", 8, 512,
           4, 1, 1, 1, 8, "hybridep", False, unpriced="CUDA graphs: attn, moe_router, moe_preprocess"),
    Recipe(f"QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1, {_QWEN}", "h100", "qwen3-30b-a3b", 16, 1024, 1, 1, 1, 1,
           16, "hybridep", False),
    Recipe(f"DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1 (= FP8_CS, FP8_MX), {_DSV3}", "b200", "deepseek-v3", 256, 2048, 1, 1,
           16, 1, 8, "hybridep", False, ("mla_up_proj",)),
    Recipe(f"DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_CS_V2, {_DSV3}", "b200", "deepseek-v3", 256, 4096, 1, 1, 16, 1, 8,
           "hybridep", False, ("mla_up_proj",)),
    Recipe(f"DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2, {_DSV3}", "b200", "deepseek-v3", 256, 4096, 1, 1, 8, 2, 32,
           "deepep", True, ("mla_up_proj", "mlp"), "CUDA graphs: attn, moe_router, moe_preprocess"),
    Recipe(f"DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1 (= FP8_CS), {_DSV3}", "h100", "deepseek-v3", 1024, 8192, 1, 2, 8, 4,
           64, "hybridep", False, ("mla_up_proj", "mlp")),
    # GB200 (read 2026-12-05, before the GB200 MoE table was priced)
    Recipe(f"QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_{{BF16,FP8_CS,FP8_MX}}_V1, {_QWEN}", "gb200", "qwen3-30b-a3b", 8, 512,
           4, 1, 1, 1, 8, "hybridep", False, unpriced=_GRAPHS),
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_{{BF16,FP8_CS,FP8_MX}}_V1, {_QWEN}", "gb200", "qwen3-235b-a22b", 64,
           1024, 1, 1, 8, 1, 8, "hybridep", False, unpriced=_GRAPHS),
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_BF16_V2, {_QWEN}", "gb200", "qwen3-235b-a22b", 256, 8192, 1, 1, 8, 1,
           8, "hybridep", False, unpriced=_GRAPHS),
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_CS_V2, {_QWEN}", "gb200", "qwen3-235b-a22b", 256, 8192, 1, 1, 8,
           1, 32, "hybridep", False, unpriced=_GRAPHS),
    Recipe(f"QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2, {_QWEN}", "gb200", "qwen3-235b-a22b", 256, 8192, 1, 1, 8,
           3, 32, "hybridep", False, unpriced=_GRAPHS),
    *(Recipe(f"DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_{variant}_V{v}, {_DSV3}", "gb200", "deepseek-v3", 256, gbs, 1, 1, 4, 4,
             64, "hybridep", overlap, modules, unpriced, (prec,))
      for v, gbs in ((1, 2048), (2, 4096))
      for variant, prec, overlap, modules, unpriced in (
          ("FP8_CS", "fp8_cs", False, ("mlp",), _GRAPHS), ("BF16", "bf16", False, ("mla_up_proj",), _GRAPHS),
          ("FP8_MX", "fp8_mx", True, ("mla_up_proj",), _MX_DSV3))),
)

#: Recipe sets a published table may name (its defaults' "recipes").
RECIPE_SETS = {"megatron-bridge": MEGATRON_BRIDGE}


def recipe_for(settings: dict[str, Any], recipes: tuple[Recipe, ...] = MEGATRON_BRIDGE) -> Recipe | None:
    """The config whose plan equals a row's (its merged settings: gpu, model, n_gpus, global_batch,
    micro_batch, tp, pp, vpp, ep; absent parallel degrees read as 1) and, where configs name precisions,
    whose precision is the row's `recipe_precision`; None when none matches, or when the matches state
    different facts (a row that does not say which variant it ran)."""
    plan = (settings.get("gpu"), settings.get("model"), settings.get("n_gpus"), settings.get("global_batch"),
            settings.get("micro_batch", 1), settings.get("tp", 1), settings.get("pp", 1), settings.get("vpp", 1),
            settings.get("ep", 1))
    variant = settings.get("recipe_precision")
    found = [r for r in recipes
             if r.plan() == plan and (not r.precisions or variant is None or variant in r.precisions)]
    if not found or any(r.facts() != found[0].facts() for r in found[1:]):
        return None
    return found[0]
