"""Software stacks as named, versioned profiles: what a training framework release runs (attention kernel,
fused FP8 casts, TP / FSDP / CP overlap, how its collectives cross nodes) and the fractions of the peaks its
kernels reach, each fitted only on that stack's own calibration rows.

A profile is data: `StackProfile` below, one per stack release, in PROFILES. Its kernel constants
(`fitted`: gemm and attention per GPU family, fp8_gemm and kernel_us shared) come from
validation.fit_profile over the calibration rows of the stack's own published tables (`tables`), never
another stack's; `calibration_rows` names every row the fit saw ("table/row id"). Where a stack has no
calibration rows on a GPU family the constants it lacks are the physics defaults (training.PHYSICS_FAMILY:
what the best measured kernels reach), and the profile says so.

What is fitted, per family with calibration rows (validation.fit_params): with >= 10 rows, gemm and
attention separately; with 1-9, one scale on both physics defaults (the rows cannot separate them);
fp8_gemm when >= 10 fp8 and >= 10 bf16 rows; kernel_us when >= 10 rows. The rest: physics.

The overlap facts are inputs of the cost model (Training.tp_overlap, cp_comm, fsdp prefetch through
dp_overlap, ep_overlap, flat or hierarchical collectives), with the source that states each.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from wavefront import __version__
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner.training import (
    FAMILY_OF,
    PHYSICS_FAMILY,
    PHYSICS_SHARED,
    Efficiency,
)

#: Training fields a profile sets (and that a published table may restate for one run).
PROFILE_FIELDS = ("stack", "attention_kernel", "tp_overlap", "cp_comm", "ep_overlap", "op_recompute_mm",
                  "loss_logits", "recompute_early_stop")


@dataclass(frozen=True)
class StackProfile:
    """One stack release. kernel_family: "megatron" (Transformer Engine: FP8 casts fused into the norm and
    activation kernels) or "fsdp" (PyTorch-native: separate cast kernels), Training.stack. fitted: the
    constants its own calibration rows fixed ({"h100": {"gemm": .., "attention": ..}, "shared": {..}});
    every constant not there is a physics default. facts: (term, what the stack does and who says so)."""

    name: str
    version: str
    what: str
    kernel_family: str
    attention_kernel: str
    tp_overlap: float
    cp_comm: str
    hierarchical: bool = True
    ep_overlap: float = 0.0
    op_recompute_mm: float = 0.0
    loss_logits: str = "vocab-parallel"  # how the loss holds the logits (training.LOSS_LOGITS)
    recompute_early_stop: bool = False  # non-reentrant checkpoint early stop (Training.recompute_early_stop)
    facts: tuple[tuple[str, str], ...] = ()
    tables: tuple[str, ...] = ()
    calibration_rows: tuple[str, ...] = ()
    fitted: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version}"

    def constants(self, family: str) -> dict[str, tuple[float, str]]:
        """constant -> (value, "fitted" | "physics") for a GPU family."""
        fam, shared = self.fitted.get(family, {}), self.fitted.get("shared", {})
        out = {k: (fam[k], "fitted") if k in fam else (v, "physics") for k, v in PHYSICS_FAMILY[family].items()}
        return out | {k: (shared[k], "fitted") if k in shared else (v, "physics") for k, v in PHYSICS_SHARED.items()}

    def efficiency(self, gpu_key: str) -> Efficiency:
        """The kernel constants of this stack on a device-table GPU."""
        if gpu_key not in FAMILY_OF:
            return Efficiency.for_gpu(gpu_key)
        family, why = FAMILY_OF[gpu_key]
        c = self.constants(family)
        fitted = sorted(k for k, (_, how) in c.items() if how == "fitted")
        n = len(self.calibration_rows)
        how = (f"{', '.join(fitted)} fitted on its {n} calibration rows, the rest physics defaults" if fitted
               else f"physics defaults: no {family.upper()} calibration rows of this stack" + (f" ({n} elsewhere)"
                                                                                               if n else ""))
        return Efficiency(gemm=c["gemm"][0], attention=c["attention"][0], kernel_us=c["kernel_us"][0],
                          fp8_gemm=c["fp8_gemm"][0], moe_layer_us=c["moe_layer_us"][0],
                          source=f"stack {self.key}: {how}; {why}")

    def training_fields(self) -> dict[str, Any]:
        """The Training fields this profile sets (PROFILE_FIELDS)."""
        return {"stack": self.kernel_family, "attention_kernel": self.attention_kernel,
                "tp_overlap": self.tp_overlap, "cp_comm": self.cp_comm, "ep_overlap": self.ep_overlap,
                "op_recompute_mm": self.op_recompute_mm, "loss_logits": self.loss_logits,
                "recompute_early_stop": self.recompute_early_stop}

    def explain(self, gpu_key: str) -> list[str]:
        """What `--explain` prints: the profile's terms, where each constant came from, the rows it was
        fitted on."""
        family = FAMILY_OF.get(gpu_key, ("h100", ""))[0]
        casts = "fused (Transformer Engine)" if self.kernel_family == "megatron" else "separate kernels"
        lines = [f"stack profile {self.key}: {self.what}",
                 f"  kernels {self.kernel_family} (FP8 casts {casts}), "
                 f"attention {self.attention_kernel}, TP overlap {self.tp_overlap:g}, CP {self.cp_comm}, "
                 f"EP overlap {self.ep_overlap:g}, op recompute of matmuls {self.op_recompute_mm:g}, "
                 f"loss logits {self.loss_logits}, collectives {'hierarchical' if self.hierarchical else 'flat'}, "
                 f"recompute early stop {'on' if self.recompute_early_stop else 'off'}"]
        lines += [f"  {term}: {text}" for term, text in self.facts]
        lines.append(f"  constants ({family.upper()} family): " + ", ".join(
            f"{k} {v:g} ({how})" for k, (v, how) in self.constants(family).items()))
        if self.calibration_rows and not self.fitted:
            lines.append(f"  {len(self.calibration_rows)} calibration row(s) of its own, too few to fit a constant "
                         "(validation.MIN_FIT_ROWS per GPU family): physics defaults (training.PHYSICS_FAMILY)")
            lines += [f"    {r}" for r in self.calibration_rows]
        elif self.calibration_rows:
            lines.append(f"  fitted on {len(self.calibration_rows)} calibration rows of its own tables "
                         f"({', '.join(self.tables)}):")
            lines += [f"    {r}" for r in self.calibration_rows]
        else:
            lines.append("  no calibration rows of this stack: every constant is a physics default "
                         "(training.PHYSICS_FAMILY), none comes from another stack's fit")
        return lines


_TE_TP = ("TP comm overlap", "0.5 hidden: Transformer Engine userbuffers (--tp-comm-overlap, on in the H100 "
          "recipes; training.TP_OVERLAP)")
_TE_CP = ("CP comm", "P2P ring, K/V exchange behind the attention (TE cp_comm_type p2p)")
_TE_FA2_FIRST = ("attention kernel", "FlashAttention-2 (flash-attn): Transformer Engine releases before mid-2024 "
                 "rank flash-attn above their cuDNN backend ('TransformerEngine prioritizes FlashAttention over "
                 "FusedAttention', DotProductAttention's docstring then); the cuDNN preference on Hopper is first "
                 "stated in NeMo's docs by NVIDIA/NeMo#9188, May 2024, after this release")
_MEGATRON_DP = ("DP overlap", "--overlap-grad-reduce / --overlap-param-gather (distributed optimizer); with "
                "interleaving each model chunk's reduction and gather run on their own, under the other chunks' "
                "compute (align_grad_reduce; pipeline.interleaved_reduce_exposed)")
_FSDP2 = ("FSDP prefetch", "FSDP2 forward/backward prefetch of the next unit's all-gather; "
          "reshard after forward")
_NO_TP_OVERLAP = ("TP comm overlap", "none: DTensor TP collectives on the critical path (async TP off)")
_TITAN_OP_AC = ("per-op checkpointing", "saves mm / attention / reduce-scatter outputs but marks every second "
                "mm/linear PREFER_RECOMPUTE (torchtitan activation_checkpoint.py): recompute=op reruns half the "
                "matmul forward")
_TITAN_FULL_AC = ("full / layer checkpointing", "ptd_checkpoint_wrapper per block (non-reentrant): the recomputation "
                  "stops before w2 in bf16 (Training.recompute_early_stop)")
_MB_MOE = ("MoE dispatch", "per model and GPU in the recipes: alltoall, or DeepEP / HybridEP (a token sent once "
           "per node: --ep-dispatch deepep), EP all-to-all overlap in some (--ep-overlap); the published rows take "
           "the facts of the config with their exact plan (planner/recipes.py)")
_EARLY_STOP = ("full checkpointing", "non-reentrant torch.utils.checkpoint per block, which (PyTorch >= 2.1) stops "
               "recomputing once the backward's last saved tensor exists: the MLP down projection is not rerun "
               "in bf16 (Training.recompute_early_stop)")

# <fitted: generated from validation.fit_all(tests/data/published); test_planner_accuracy.py checks it>
#: Each profile's constants fitted on its own calibration rows (validation.fit_profile); absent: physics.
FITTED: dict[str, dict[str, Any]] = {
    "torchtitan/2024": {
        "a100": {"attention": 0.471, "gemm": 0.629},
    },
    "llm-foundry/2023": {
        "a100": {"attention": 0.348, "gemm": 0.633},
        "h100": {"attention": 0.176, "gemm": 0.547},
        "shared": {"kernel_us": 0.003},
    },
    "nemo/24.03": {
        "h100": {"attention": 0.293, "gemm": 0.689},
    },
    "nemo/24.07": {
        "h100": {"attention": 0.296, "gemm": 0.695},
    },
    "nemo/24.09": {
        "h100": {"attention": 0.281, "gemm": 0.659},
    },
    "megatron-core-te/2025": {
        "b200": {"attention": 0.255, "gemm": 0.561},
        "h100": {"attention": 0.343, "gemm": 0.806},
        "shared": {"kernel_us": 0.003, "moe_layer_us": 1434.823},
    },
    "megatron-lm/2021": {
        "a100": {"attention": 0.546, "gemm": 0.729},
    },
    "deepspeed/2021": {
        "a100": {"attention": 0.669, "gemm": 0.892},
    },
    "meta-llama3/2024": {
        "h100": {"attention": 0.249, "gemm": 0.584},
    },
}
#: The rows each fit saw ("table/row id"), the calibration rows of the stack's own tables.
CALIBRATION_ROWS: dict[str, tuple[str, ...]] = {
    "torchtitan/2024": (
        "torchtitan_a100_2024/llama3-8b 64gpu fsdp64 mb1 ac selective layer",
        "torchtitan_a100_2024/llama2-70b 64gpu fsdp64 mb2 ac full",
    ),
    "llm-foundry/2023": (
        "llmfoundry_mpt/H100 bf16 13b s2048 n64 mb2 ga1",
        "llmfoundry_mpt/H100 bf16 13b s1024 n8 mb40 ga3",
        "llmfoundry_mpt/H100 bf16 7b s8192 n8 mb8 ga2",
        "llmfoundry_mpt/H100 bf16 3b s2048 n32 mb6 ga3",
        "llmfoundry_mpt/H100 bf16 3b s1024 n8 mb20 ga6",
        "llmfoundry_mpt/H100 bf16 1b s1024 n8 mb18 ga4",
        "llmfoundry_mpt/H100 bf16 760m s32768 n8 mb1 ga2",
        "llmfoundry_mpt/H100 bf16 760m s2048 n32 mb24 ga1",
        "llmfoundry_mpt/H100 bf16 760m s2048 n16 mb24 ga1",
        "llmfoundry_mpt/H100 fp8 3b s512 n8 mb40 ga6",
        "llmfoundry_mpt/H100 fp8 1b s32768 n8 mb1 ga4",
        "llmfoundry_mpt/H100 fp8 350m s32768 n8 mb1 ga4",
        "llmfoundry_mpt/A100-80GB bf16 30b s8192 n8 mb1 ga21",
        "llmfoundry_mpt/A100-80GB bf16 30b s4096 n8 mb1 ga21",
        "llmfoundry_mpt/A100-80GB bf16 30b s1024 n8 mb6 ga21",
        "llmfoundry_mpt/A100-80GB bf16 30b s512 n8 mb12 ga21",
        "llmfoundry_mpt/A100-80GB bf16 13b s2048 n8 mb2 ga3",
        "llmfoundry_mpt/A100-80GB bf16 3b s8192 n8 mb3 ga6",
        "llmfoundry_mpt/A100-80GB bf16 1b s32768 n8 mb1 ga4",
        "llmfoundry_mpt/A100-80GB bf16 1b s4096 n8 mb7 ga4",
        "llmfoundry_mpt/A100-80GB bf16 1b s1024 n8 mb18 ga4",
        "llmfoundry_mpt/A100-80GB bf16 760m s32768 n8 mb1 ga2",
        "llmfoundry_mpt/A100-80GB bf16 350m s32768 n8 mb2 ga2",
        "llmfoundry_mpt/A100-80GB bf16 350m s1024 n8 mb64 ga2",
        "llmfoundry_mpt/A100-80GB bf16 125m s65536 n8 mb1 ga2",
        "llmfoundry_mpt/A100-80GB bf16 125m s8192 n8 mb8 ga2",
        "llmfoundry_mpt/A100-80GB bf16 125m s4096 n8 mb16 ga2",
        "llmfoundry_mpt/A100-80GB bf16 125m s2048 n8 mb32 ga2",
        "llmfoundry_mpt/A100-40GB bf16 30b s2048 n32 mb4 ga1",
        "llmfoundry_mpt/A100-40GB bf16 13b s8192 n8 mb1 ga16",
        "llmfoundry_mpt/A100-40GB bf16 13b s4096 n8 mb2 ga16",
        "llmfoundry_mpt/A100-40GB bf16 13b s2048 n32 mb14 ga1",
        "llmfoundry_mpt/A100-40GB bf16 13b s1024 n8 mb8 ga16",
        "llmfoundry_mpt/A100-40GB bf16 7b s2048 n64 mb18 ga1",
        "llmfoundry_mpt/A100-40GB bf16 7b s1024 n8 mb24 ga4",
        "llmfoundry_mpt/A100-40GB bf16 3b s32768 n8 mb1 ga4",
        "llmfoundry_mpt/A100-40GB bf16 3b s2048 n64 mb6 ga1",
        "llmfoundry_mpt/A100-40GB bf16 3b s2048 n32 mb6 ga1",
        "llmfoundry_mpt/A100-40GB bf16 1b s32768 n8 mb1 ga4",
        "llmfoundry_mpt/A100-40GB bf16 1b s4096 n8 mb4 ga8",
        "llmfoundry_mpt/A100-40GB bf16 1b s2048 n64 mb10 ga1",
        "llmfoundry_mpt/A100-40GB bf16 760m s2048 n128 mb12 ga1",
        "llmfoundry_mpt/A100-40GB bf16 760m s2048 n64 mb12 ga1",
        "llmfoundry_mpt/A100-40GB bf16 350m s16384 n8 mb2 ga4",
        "llmfoundry_mpt/A100-40GB bf16 350m s4096 n8 mb8 ga4",
        "llmfoundry_mpt/A100-40GB bf16 350m s2048 n16 mb18 ga1",
        "llmfoundry_mpt/A100-40GB bf16 350m s2048 n8 mb16 ga4",
        "llmfoundry_mpt/A100-40GB bf16 350m s1024 n8 mb32 ga4",
        "llmfoundry_mpt/A100-40GB bf16 125m s16384 n8 mb2 ga3",
        "llmfoundry_mpt/A100-40GB bf16 125m s8192 n8 mb5 ga3",
        "llmfoundry_mpt/A100-40GB bf16 125m s4096 n8 mb13 ga3",
        "llmfoundry_mpt/A100-40GB bf16 125m s2048 n64 mb26 ga1",
        "llmfoundry_mpt/A100-40GB bf16 125m s2048 n32 mb26 ga1",
        "llmfoundry_mpt/A100-40GB bf16 125m s2048 n16 mb26 ga1",
        "llmfoundry_mpt/A100-40GB bf16 125m s2048 n8 mb26 ga3",
        "llmfoundry_mpt/A100-40GB bf16 125m s1024 n8 mb52 ga3",
    ),
    "nemo/24.03": (
        "nemo_2403_long_sequence/llama2-7b seq4k 4gpu tp1 pp1 cp1 dp4 mb1 gbs1024",
        "nemo_2403_long_sequence/llama2-7b seq16k 16gpu tp2 pp1 cp1 dp8 mb1 gbs256",
    ),
    "nemo/24.07": (
        "nemo_2407_h100_fp8/llama2-70b 64gpu tp4 pp4 cp1 vp20 mb1 gbs128",
        "nemo_2407_h100_fp8/nemotron4-340b 128gpu tp8 pp8 cp1 vp12 mb1 gbs32",
        "nemo_2407_h100_fp8/llama3-70b 64gpu tp4 pp4 cp2 vp5 mb1 gbs128",
    ),
    "nemo/24.09": (
        "dgxc_nemo_2409_h100/llama3.1-8b fp8 16gpu tp1 pp1 cp2 vp1 dp8 mb1 gbs256",
        "dgxc_nemo_2409_h100/llama3.1-8b fp8 64gpu tp1 pp1 cp2 vp1 dp32 mb1 gbs1024",
        "dgxc_nemo_2409_h100/llama3.1-8b fp8 128gpu tp1 pp1 cp2 vp1 dp64 mb1 gbs2048",
        "dgxc_nemo_2409_h100/llama3.1-70b bf16 64gpu tp4 pp4 cp2 vp5 dp2 mb1 gbs128",
        "dgxc_nemo_2409_h100/llama3.1-70b bf16 256gpu tp4 pp4 cp2 vp5 dp8 mb1 gbs512",
        "dgxc_nemo_2409_h100/llama3.1-70b bf16 512gpu tp4 pp4 cp2 vp5 dp16 mb1 gbs1024",
        "dgxc_nemo_2409_h100/llama3.1-70b bf16 1024gpu tp4 pp4 cp2 vp5 dp32 mb1 gbs2048",
        "dgxc_nemo_2409_h100/llama3.1-405b-126l bf16 2304gpu tp8 pp9 cp2 vp7 dp16 mb1 gbs1008",
        "dgxc_nemo_2409_h100/llama3.1-405b-126l fp8 1152gpu tp8 pp9 cp2 vp7 dp8 mb1 gbs504",
    ),
    "megatron-core-te/2025": (
        "nemo_2502_fp8/b200 llama3-8b 8gpu tp1 pp1 cp1 vp1 mb2 gbs128",
        "nemo_2502_fp8/b200 nemotron4-15b 64gpu tp1 pp1 cp1 vp1 mb2 gbs256",
        "nemo_2502_fp8/h100 nemo-gpt3-175b 512gpu tp4 pp8 cp1 vp6 mb2 gbs2048",
        "nemo_2504_long_sequence_b200/llama3-8b seq32k 8gpu tp1 pp1 cp2 dp4 mb1 gbs128",
        "nemo_2504_long_sequence_b200/llama3-8b seq256k 64gpu tp4 pp1 cp4 dp4 mb1 gbs16",
        "megatron_bridge_gb200/25.09 gb200 llama3-405b 128gpu fsdp64 tp2 pp1 cp1 vp1 mb1",
        "megatron_bridge_gb200/26.02 gb200 llama3-70b 64gpu fsdp64 tp1 pp1 cp1 vp1 mb2",
        "megatron_bridge_gb200/26.02.01 gb200 llama3-405b 256gpu fsdp0 tp4 pp16 cp1 vp4 mb1",
        "megatron_bridge_gb200/26.04 gb200 llama3-405b 256gpu fsdp0 tp4 pp16 cp1 vp4 mb1",
        "megatron_bridge_gb200/26.04.01 gb200 llama3-70b 64gpu fsdp64 tp1 pp1 cp1 vp1 mb2",
        "megatron_bridge_gb200/26.06 gb200 llama3-405b 256gpu fsdp0 tp4 pp16 cp1 vp4 mb1",
        "nemo_2504_2507_gb200/25.04 gb200 nemo-gpt3-175b 128gpu fsdp0 tp4 pp4 cp1 vp12 mb2",
        "megatron_bridge_2509_moe/b200 qwen3-235b-a22b 64gpu tp1 pp8 cp1 vp2 ep8 mb1",
        "megatron_bridge_2511_moe/b200 qwen3-30b-a3b 8gpu tp1 pp1 cp1 vp1 ep8 mb1",
        "megatron_bridge_2602_2606_moe/26.04.01 b200 qwen3-30b-a3b 8gpu tp1 pp1 cp1 vp1 ep8 mb4",
        "megatron_bridge_2602_2606_moe/26.04.01 h100 qwen3-30b-a3b 16gpu tp1 pp1 cp1 vp1 ep16 mb1",
        "megatron_bridge_2602_2606_moe/26.04.01 b200 qwen3-235b-a22b 256gpu tp1 pp8 cp1 vp1 ep8 mb1",
        "megatron_bridge_2602_2606_moe/26.04 b200 deepseek-v3 256gpu tp1 pp16 cp1 vp1 ep8 mb1",
        "megatron_bridge_2602_2606_moe/26.04 b200 qwen3-30b-a3b 8gpu tp1 pp1 cp1 vp1 ep8 mb4",
        "megatron_bridge_2602_2606_moe/26.04 h100 qwen3-30b-a3b 16gpu tp1 pp1 cp1 vp1 ep16 mb1",
        "megatron_bridge_2602_2606_moe/26.04 h100 qwen3-235b-a22b 256gpu tp2 pp8 cp1 vp4 ep32 mb1",
        "megatron_bridge_2602_2606_moe/26.02.01 h100 qwen3-30b-a3b 16gpu tp1 pp2 cp1 vp12 ep8 mb1",
        "megatron_bridge_2602_moe/26.02 b200 deepseek-v3 256gpu tp1 pp16 cp1 vp1 ep8 mb1",
        "megatron_bridge_2602_moe/26.02 b200 qwen3-30b-a3b 8gpu tp1 pp1 cp1 vp1 ep8 mb1",
        "megatron_bridge_gb200_moe/25.09 gb200 qwen3-30b-a3b 8gpu tp1 pp1 cp1 vp1 ep8 mb4 fp8_mx",
        "megatron_bridge_gb200_moe/25.11 gb200 qwen3-30b-a3b 8gpu tp1 pp1 cp1 vp1 ep8 mb4 fp8_mx",
        "megatron_bridge_gb200_moe/26.02.01 gb200 qwen3-235b-a22b 256gpu tp1 pp8 cp1 vp1 ep32 mb1 fp8_mx",
    ),
    "megatron-lm/2021": (
        "narayanan2021_table1/3.6B",
        "narayanan2021_table1/7.5B",
        "narayanan2021_table1/18.4B",
        "narayanan2021_table1/39.1B",
        "narayanan2021_table1/145.6B",
        "narayanan2021_table1/529.6B",
        "narayanan2021_table2/PTD-P 175B 384",
        "narayanan2021_table2/PTD-P 530B 1120",
    ),
    "deepspeed/2021": (
        "narayanan2021_table2/ZeRO-3 530B 1120",
    ),
    "meta-llama3/2024": (
        "llama3_2024_table4/8K-8192",
    ),
}
# </fitted>


#: The profiles. Fitted constants: validation.fit_profile on each stack's calibration rows (docs/planner.md).
_PROFILES = (
    StackProfile(
        "wavefront-train", __version__, "`wavefront train`: PyTorch-native FSDP2 + DTensor TP/SP + PP + ring CP, "
        "SDPA flash attention (FlashAttention-2 class)", "fsdp", "fa2", 0.0, "ring", loss_logits="fused",
        recompute_early_stop=True,
        facts=(_NO_TP_OVERLAP, _FSDP2, _EARLY_STOP,
               ("CP comm", "ring attention (wavefront.parallel.ring_attention, zigzag)"),
               ("loss", "the patched model's fused LM-head cross-entropy (patching/loss.py, on by default): no "
                        "logits formed"))),
    StackProfile(
        "torchtitan", "2025", "torchtitan (PyTorch-native FSDP2 + TP + PP, SDPA flash attention, torch.compile)",
        "fsdp", "fa2", 0.0, "ring", op_recompute_mm=0.5, loss_logits="native", recompute_early_stop=True,
        facts=(_NO_TP_OVERLAP, _FSDP2, _TITAN_OP_AC, _TITAN_FULL_AC,
               ("CP comm", "ring attention (torch context_parallel, allgather/alltoall rotation)"))),
    StackProfile(
        "torchtitan", "2024", "torchtitan 2024 (PyTorch-native FSDP2 + TP + PP, SDPA flash attention)",
        "fsdp", "fa2", 0.0, "ring", op_recompute_mm=0.5, loss_logits="native", recompute_early_stop=True,
        facts=(_NO_TP_OVERLAP, _FSDP2, _TITAN_OP_AC, _TITAN_FULL_AC),
        tables=("torchtitan_a100_2024", "torchtitan_llama3_h100_202412")),
    StackProfile(
        "llm-foundry", "2023", "MosaicML llm-foundry on Composer, FSDP1 (FULL_SHARD/HYBRID_SHARD), "
        "flash-attn 2, TE FP8 linears", "fsdp", "fa2", 0.0, "ring", recompute_early_stop=True,
        facts=(("FSDP prefetch", "FSDP1 BACKWARD_PRE prefetch, forward prefetch off"),
               ("full checkpointing", "Composer's checkpoint wrapper per MPTBlock with activation_checkpointing_"
                "reentrant: false (the benchmark configs): non-reentrant, the down projection not rerun in bf16 "
                "(Training.recompute_early_stop); TE fp8 linears force reentrant and rerun the whole block")),
        tables=("llmfoundry_mpt",)),
    StackProfile(
        "nemo", "24.03", "NeMo 24.03.01 (Megatron-Core + Transformer Engine), FlashAttention-2 through Transformer "
        "Engine, P2P ring context parallelism", "megatron", "fa2", 0.5, "ring",
        facts=(_TE_TP, _TE_CP, _MEGATRON_DP, _TE_FA2_FIRST), tables=("nemo_2403_long_sequence",)),
    StackProfile(
        "nemo", "24.07", "NeMo 24.07 (Megatron-Core + Transformer Engine), cuDNN fused attention",
        "megatron", "cudnn", 0.5, "ring", facts=(_TE_TP, _TE_CP, _MEGATRON_DP), tables=("nemo_2407_h100_fp8",)),
    StackProfile(
        "nemo", "24.09", "NeMo 24.09 (Megatron-Core 0.9 + Transformer Engine 1.10), cuDNN fused attention",
        "megatron", "cudnn", 0.5, "ring", facts=(_TE_TP, _TE_CP, _MEGATRON_DP), tables=("dgxc_nemo_2409_h100",)),
    StackProfile(
        "megatron-core-te", "2025", "Megatron-Core + Transformer Engine, 2025 releases and their 2026 successors: "
        "NeMo 25.02-25.07 and Megatron-Bridge 25.09-26.06 (the NeMo 2 recipes moved there), cuDNN fused attention",
        "megatron", "cudnn", 0.5, "ring", facts=(_TE_TP, _TE_CP, _MEGATRON_DP, _MB_MOE),
        tables=("nemo_2502_fp8", "nemo_2504_long_sequence_b200", "megatron_bridge_2509", "megatron_bridge_2511",
                "megatron_bridge_2602", "megatron_bridge_2602_2606", "megatron_bridge_gb200", "nemo_2504_2507_gb200",
                "megatron_bridge_2509_moe",
                "megatron_bridge_2511_moe", "megatron_bridge_2602_2606_moe", "megatron_bridge_2602_moe",
                "megatron_bridge_gb200_moe")),
    StackProfile(
        "nemo-automodel", "2025", "NeMo Automodel: PyTorch FSDP2 + expert parallel with Transformer Engine "
        "kernels (cuDNN attention)", "fsdp", "cudnn", 0.0, "ring", facts=(_FSDP2,), tables=("automodel_moe",)),
    StackProfile(
        "megatron-lm", "2021", "Megatron-LM 2021 (PTD-P; Narayanan et al. 2021, Korthikanti et al. 2022): "
        "materialised attention, fused kernels, no comm overlap", "megatron", "fa2", 0.0, "ring",
        facts=(("TP comm overlap", "none (2021)"), ("DP overlap", "gradient all-reduce after the backward")),
        tables=("narayanan2021_table1", "narayanan2021_table2")),
    StackProfile(
        "deepspeed", "2021", "DeepSpeed ZeRO-3 (2021; the ZeRO-3 rows of Narayanan et al. 2021 Table 2)",
        "megatron", "fa2", 0.0, "ring", hierarchical=False,
        facts=(("collectives", "flat: one ring over every GPU at one NIC's rate (what the published rows "
                               "imply, docs/planner.md)"), ("ZeRO-3", "gathers per micro-batch, prefetched")),
        tables=("narayanan2021_table2",)),
    StackProfile(
        "meta-llama3", "2024", "Meta's Llama 3 training stack (Dubey et al. 2024, Sec. 3.3): all-gather CP, "
        "tunable interleaved PP", "megatron", "fa2", 0.0, "all-gather",
        facts=(("CP comm", "all-gather of K and V (Sec. 3.3.2), exposed"), ("TP comm overlap", "not stated: 0")),
        tables=("llama3_2024_table4",)),
)
PROFILES: dict[str, StackProfile] = {
    p.key: replace(p, fitted=FITTED.get(p.key, {}), calibration_rows=CALIBRATION_ROWS.get(p.key, ()))
    for p in _PROFILES}
#: The default profile: `wavefront train`'s own stack (a plan made on it says so in one line).
DEFAULT_PROFILE = f"wavefront-train/{__version__}"
#: Names without a version (a name with several versions: the newest), and releases of a profile's stack.
ALIASES = {p.name: p.key for p in PROFILES.values() if sum(q.name == p.name for q in PROFILES.values()) == 1} | {
    "wavefront-train": DEFAULT_PROFILE, "nemo/25.02": "megatron-core-te/2025", "megatron-bridge/2025":
    "megatron-core-te/2025", "torchtitan": "torchtitan/2025", "nemo": "nemo/24.07"}
#: The old `--stack megatron|fsdp` names: the profile each maps to (with a deprecation line).
DEPRECATED = {"megatron": "megatron-core-te/2025", "fsdp": "torchtitan/2025"}


def resolve(name: str) -> tuple[StackProfile, str | None]:
    """(profile, deprecation line or None) for a --stack value; an unknown name is a ValueError naming
    --stack and the profiles."""
    if name in DEPRECATED:
        key = DEPRECATED[name]
        return PROFILES[key], f"--stack {name} is deprecated: it now means the profile {key}; name a profile"
    key = ALIASES.get(name, name)
    if key not in PROFILES:
        raise ValueError(f"--stack: unknown stack profile {name!r}; expected one of {', '.join(PROFILES)}")
    return PROFILES[key], None


def get_profile(name: str) -> StackProfile:
    return resolve(name)[0]


def explain_stack(name: str | None, gpus: str = "8xh100") -> list[str]:
    """`wavefront plan --explain`: the profile named by --stack (None: the default, said so), for the GPU of
    a COUNTxGPU cluster; a deprecated name says what it maps to."""
    profile, deprecation = resolve(name or DEFAULT_PROFILE)
    head = [f"warning: {deprecation}"] if deprecation else []
    head += [] if name else [f"stack profile defaulted to {profile.key} (`wavefront train`'s own)"]
    return head + profile.explain(get_gpu(gpus.partition("x")[2] or gpus).key)
