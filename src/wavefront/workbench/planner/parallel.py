"""A parallel plan: how the GPUs, the batch and the memory-saving switches are laid out.

Rank layout (Megatron-LM order): tensor parallel innermost, then context parallel, then data parallel,
then pipeline parallel outermost, so n_gpus = tp * cp * dp * pp. A step processes the global batch of
B sequences as dp replicas x n_micro micro-batches of `micro_batch` sequences; context parallelism splits
each sequence over cp ranks (ring attention), sequence parallelism splits the non-tensor-parallel regions
of a layer over the tp ranks (Korthikanti et al. 2022).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from wavefront.workbench.planner.model import RECOMPUTE_MODES, ModelSpec
from wavefront.workbench.planner.pipeline import ScheduleDeadlock, bubble_stage_times, custom_round

ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class PlanConfig:
    tp: int = 1
    sp: bool = False
    pp: int = 1
    vpp: int = 1  # virtual pipeline stages (model chunks) per rank: 1 = 1F1B, > 1 = interleaved 1F1B
    cp: int = 1
    dp: int = 1
    zero: int = 0  # 0 DDP; 1 optimizer states (Megatron distributed optimizer); 2 + gradients; 3 FSDP
    recompute: str = "none"
    micro_batch: int = 1
    zero_bubble: bool = False  # ZB-H1 schedule (Qi et al. 2023): W split off the backward (pipeline.zb_h1_order)
    shard: int = 0  # ZeRO-3 sharding group (HSDP: shard within `shard` ranks, replicate across); 0: all d
    ep: int = 1  # expert parallel (MoE): experts split over ep ranks folded into tp*cp*dp (moe.py)

    @property
    def n_gpus(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def schedule(self) -> str:
        if self.pp == 1:
            return "none"
        if self.zero_bubble:
            return "zb-h1"
        return "1f1b" if self.vpp == 1 else f"interleaved-{self.vpp}"

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel degree: the ranks holding the same experts (tp*cp*dp / ep, expert TP 1)."""
        return max(1, self.tp * self.cp * self.dp // self.ep)

    def shard_group(self) -> int:
        """Ranks one ZeRO-3 shard spans: `shard` (HSDP) or every data-parallel rank."""
        d = self.dp * self.cp
        return self.shard if self.zero == 3 and 0 < self.shard < d else d

    def label(self) -> str:
        """Compact: "tp8+sp pp4v2 cp2 dp4 z1 sel mb1" (cp omitted when 1)."""
        pp = f"pp{self.pp}" + (f"v{self.vpp}" if self.vpp > 1 else "") + ("zb" if self.zero_bubble else "")
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        rc = {"none": "none", "selective": "sel", "full": "full", "op": "op", "every-other": "eo"}.get(
            self.recompute, self.recompute)
        z = f"z{self.zero}" + (f"/h{self.shard}" if self.zero == 3 and self.shard else "")
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        return f"tp{self.tp}{'+sp' if self.sp else ''} {pp}{cp} dp{self.dp}{ep} {z} {rc} mb{self.micro_batch}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"n_gpus": self.n_gpus, "schedule": self.schedule, "label": self.label()}


def layers_per_stage(n_layers: int, cfg: PlanConfig) -> int:
    """Layers on the busiest pipeline rank: L / pp, rounded up when the stages split unevenly (Llama 3
    405B: 126 layers on 16 stages, one fewer on the first and last; Dubey et al. 2024, Sec. 3.3.2)."""
    chunk = -(-n_layers // (cfg.pp * cfg.vpp))
    return chunk * cfg.vpp


def n_micro_batches(cfg: PlanConfig, global_batch_seqs: int) -> int:
    """Micro-batches per pipeline per step (gradient-accumulation steps when pp = 1)."""
    return global_batch_seqs // (cfg.micro_batch * cfg.dp)


def structural_problems(cfg: PlanConfig, model: ModelSpec, n_gpus: int, global_batch_seqs: int,
                        seq_len: int, *, allow_uneven_layers: bool = True, pp_round: int = 0,
                        offload_layers: int = 0) -> list[str]:
    """Why a plan cannot run at all (empty when it can); memory is checked separately.

    allow_uneven_layers accepts pipeline stages that do not divide the layers (the busiest stage gets
    the rounded-up share, as Megatron-LM and torchtitan split them); False demands an even split.
    pp_round: the interleaved schedule's round size N (Training.pp_round; 0: pp, Megatron-LM's): the
    micro-batches must be a multiple of N, not of pp (Llama 3's schedule, Dubey et al. 2024, Sec. 3.3.2).
    offload_layers: layers whose activations go to host memory (Training.offload_activation_layers),
    modelled with pp = 1 only (the runs that state it: Megatron FSDP without a pipeline).
    """
    dims = model.dims
    problems: list[str] = []
    if cfg.shard < 0:
        problems.append("shard must be >= 0")
    for name in ("tp", "pp", "vpp", "cp", "dp", "ep", "micro_batch"):
        if getattr(cfg, name) < 1:
            problems.append(f"{name} must be >= 1")
    if problems:
        return problems
    if cfg.n_gpus != n_gpus:
        problems.append(f"tp*cp*dp*pp = {cfg.n_gpus} is not the cluster's {n_gpus} GPUs")
    if dims.n_heads % cfg.tp:
        problems.append(f"tensor parallel {cfg.tp} does not divide {dims.n_heads} attention heads")
    if dims.n_kv_heads % cfg.tp:
        problems.append(f"tensor parallel {cfg.tp} does not divide {dims.n_kv_heads} KV heads")
    if cfg.sp and cfg.tp == 1:
        problems.append("sequence parallel needs tensor parallel > 1")
    if dims.n_layers % (cfg.pp * cfg.vpp) and not allow_uneven_layers:
        problems.append(f"pipeline stages pp*vpp = {cfg.pp * cfg.vpp} do not divide {dims.n_layers} layers")
    elif cfg.pp > dims.n_layers:
        problems.append(f"pipeline parallel {cfg.pp} exceeds the {dims.n_layers} layers")
    if cfg.zero_bubble and (cfg.pp == 1 or cfg.vpp > 1):
        problems.append("zero-bubble (ZB-H1) needs pipeline parallel > 1 and no interleaving")
    if cfg.shard and (cfg.zero != 3 or (cfg.dp * cfg.cp) % cfg.shard):
        problems.append(f"HSDP shard group {cfg.shard} needs ZeRO-3 and must divide dp*cp = {cfg.dp * cfg.cp}")
    if cfg.vpp > 1 and cfg.pp == 1:
        problems.append("interleaved schedule (vpp > 1) needs pipeline parallel > 1")
    if offload_layers and cfg.pp > 1:
        problems.append("activation offloading (offload_activation_layers) is modelled with pipeline parallel 1 "
                        "only")
    elif offload_layers >= dims.n_layers:
        problems.append(f"offload_activation_layers {offload_layers} must be below the {dims.n_layers} layers")
    if global_batch_seqs % (cfg.micro_batch * cfg.dp):
        problems.append(f"global batch of {global_batch_seqs} sequences is not divisible by micro-batch "
                        f"{cfg.micro_batch} x dp {cfg.dp}")
    elif cfg.vpp > 1 and n_micro_batches(cfg, global_batch_seqs) % (pp_round or cfg.pp):
        problems.append(f"interleaved schedule needs micro-batches ({n_micro_batches(cfg, global_batch_seqs)}) "
                        + (f"divisible by the round size N = {pp_round}" if pp_round else f"divisible by pp {cfg.pp}"))
    elif cfg.vpp > 1 and custom_round(cfg.pp, pp_round):
        try:  # an order other than Megatron-LM's: run it (pipeline.run_schedule) to see that it can
            bubble_stage_times(cfg.pp, cfg.vpp, n_micro_batches(cfg, global_batch_seqs), pp_round)
        except ScheduleDeadlock as err:
            problems.append(str(err))
    if seq_len % cfg.cp or (cfg.cp > 1 and (seq_len // cfg.cp) % 2):
        problems.append(f"context parallel {cfg.cp} needs the sequence ({seq_len}) split into 2*cp equal chunks")
    if cfg.sp and (seq_len // cfg.cp) % cfg.tp:
        problems.append(f"sequence parallel needs the local sequence ({seq_len // cfg.cp}) divisible by tp {cfg.tp}")
    if cfg.ep > 1 and model.moe is None:
        problems.append(f"expert parallel {cfg.ep} needs a mixture-of-experts model")
    elif model.moe is not None:
        if model.moe.n_experts % cfg.ep:
            problems.append(f"expert parallel {cfg.ep} does not divide {model.moe.n_experts} experts")
        if (cfg.tp * cfg.cp * cfg.dp) % cfg.ep:
            problems.append(f"expert parallel {cfg.ep} must divide tp*cp*dp = {cfg.tp * cfg.cp * cfg.dp} "
                            "(experts fold into the attention's ranks)")
        if cfg.tp > 1 and not cfg.sp:
            problems.append("MoE with tensor parallel needs sequence parallel (Megatron-Core requires it)")
    if cfg.zero not in ZERO_STAGES:
        problems.append(f"zero stage must be one of {ZERO_STAGES}")
    if cfg.recompute not in RECOMPUTE_MODES:
        problems.append(f"recompute must be one of {RECOMPUTE_MODES}")
    return problems
