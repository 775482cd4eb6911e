"""The `wavefront plan` job as a library call: a typed request in, a SearchResult out that owns its JSON
document (schema below). The CLI only declares options, renders and maps exit codes.

    from wavefront.workbench.planner import PlanRequest, plan
    result = plan(PlanRequest(model="llama3-70b", gpus=("64xh100",), precision="fp8"))
    doc = result.as_dict()          # schema "wavefront.plan/1" (docs/json/plan.md)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wavefront.shapes import ModelDims, get_model
from wavefront.workbench.planner.cluster import Cluster, make_cluster
from wavefront.workbench.planner.comm_model import load_calibration
from wavefront.workbench.planner.hf_config import dims_from_hf_config, moe_from_hf_config
from wavefront.workbench.planner.kernel_calibration import KernelCalibration, load_kernel_calibration
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.moe import MOE_MODELS, get_moe_model
from wavefront.workbench.planner.parallel import PlanConfig
from wavefront.workbench.planner.stacks import DEFAULT_PROFILE, StackProfile, resolve
from wavefront.workbench.planner.training import Efficiency, Training

SCHEMA = "wavefront.plan/1"
#: Default global batch: 4M tokens (Llama 3 405B's initial batch, Dubey et al. 2024, Sec. 3.4.1).
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024
#: What a plan is priced with when the request does not state its software stack (the header says so):
#: the profile of `wavefront train` (stacks.DEFAULT_PROFILE).
STACK_DEFAULTS = {"stack": DEFAULT_PROFILE}


#: Training fields `--fix` pins besides the plan's own (PlanConfig), each a setting a published run states:
#: the interleaved schedule's round size N (Training.pp_round: Llama 3's schedule, Dubey et al. 2024, Sec.
#: 3.3.2), what ZeRO-3 gathers at a time (Training.zero3_unit: DeepSpeed's sub-modules), what selective
#: recomputation reruns (Training.recompute_modules) and how many layers' activations go to the host
#: (Training.offload_activation_layers: Megatron-Core's CPU offloading).
TRAINING_FIX = ("pp_round", "zero3_unit", "recompute_modules", "offload_activation_layers")


def parse_fixed(items: list[str] | None) -> dict[str, Any]:
    """`--fix FIELD=VALUE` items -> {field: value} of PlanConfig fields and TRAINING_FIX; a ValueError names
    --fix."""
    fields = PlanConfig.__dataclass_fields__ | {k: Training.__dataclass_fields__[k] for k in TRAINING_FIX}
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise ValueError(f"--fix expects FIELD=VALUE with FIELD one of {', '.join(fields)}; got {item!r}")
        kind = str(fields[key].type)
        try:
            out[key] = (raw.strip().lower() in ("1", "true", "yes", "on") if "bool" in kind
                        else tuple(x.strip() for x in raw.split(",")) if "tuple" in kind
                        else int(raw) if "int" in kind else raw.strip())
        except ValueError:
            raise ValueError(f"--fix {key}: {raw!r} is not a valid value") from None
        if key in TRAINING_FIX:  # the training's own check, said as --fix's
            try:
                Training(global_batch_tokens=1, seq_len=1, **{key: out[key]})
            except ValueError as exc:
                raise ValueError(f"--fix {exc}") from None
    return out


@dataclass(frozen=True)
class CustomDims:
    """A model given by its dimensions (instead of a preset or a config.json)."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    kv_heads: int | None = None
    head_dim: int | None = None
    gated: bool = True
    tied: bool = False


@dataclass(frozen=True)
class PlanRequest:
    """Everything `wavefront plan` takes. model: a preset name, or a path to a Hugging Face config.json;
    custom: dimensions instead. Fields set to None take the documented defaults."""

    model: str | None = None
    custom: CustomDims | None = None
    head_dim: int | None = None  # overrides the preset's / config's head dim
    gpus: tuple[str, ...] = ("8xh100",)
    gpus_per_node: int = 8
    nics_per_node: int = 0
    nic_gbits: float | None = None
    hierarchical: bool = True
    intra_gbps: float | None = None
    inter_gbps: float | None = None
    intra_latency_us: float | None = None
    inter_latency_us: float | None = None
    hbm_gb: float | None = None
    hbm_tbps: float | None = None
    calibrations: tuple[str, ...] = ()
    calibrate: str | None = None  # a `wavefront bench` results store measured on the target GPU
    global_batch_tokens: int | None = None
    seq_len: int | None = None
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    precision: str = "bf16"
    optimizer: str = "adamw"
    grad_bytes: int = 4
    attention: str = "flash"
    dropout: bool = False
    kernels: str = "fused"
    stack: str | None = None  # a stack profile (stacks.PROFILES); None: STACK_DEFAULTS, and the plan says so
    fsdp_gather: str = "micro-batch"
    offload_optimizer: bool = False
    cp_comm: str | None = None  # None: the profile's (as attention_kernel, tp_overlap, ep_overlap)
    attention_kernel: str | None = None
    moe_imbalance: float = 1.0
    ep_overlap: float | None = None
    ep_dispatch: str = "all-to-all"  # Training.ep_dispatch: "deepep" sends a token once per node (DeepEP, HybridEP)
    dp_overlap: bool = True
    tp_overlap: float | None = None
    price_per_gpu_hour: float | None = None
    power_fraction: float = 0.75
    train_tokens: float = 1e12
    gemm_eff: float | None = None
    attn_eff: float | None = None
    hbm_eff: float | None = None
    memory_headroom: float = 0.90
    fixed: dict[str, Any] = field(default_factory=dict)
    rank_by: str = "time"
    top: int = 10

    @property
    def defaulted(self) -> tuple[str, ...]:
        """The software-stack fields the request left unstated (priced as STACK_DEFAULTS)."""
        return tuple(k for k in STACK_DEFAULTS if getattr(self, k) is None)

    def profile(self) -> tuple[StackProfile, str | None]:
        """(the stack profile, a deprecation line for an old --stack name or None); a ValueError names
        --stack and the profiles."""
        return resolve(self.stack or STACK_DEFAULTS["stack"])

    def model_spec(self) -> ModelSpec:
        dims = self._dims()
        if self.head_dim is not None:
            if self.head_dim < 1:
                raise ValueError(f"--head-dim must be >= 1, got {self.head_dim}")
            dims = replace(dims, head_dim=self.head_dim)
        moe_layout, mla = None, None
        if self.model and not self.custom:
            preset = get_moe_model(self.model)
            if preset is not None:
                moe_layout, mla = preset.moe, preset.mla
            elif self.model.endswith(".json") or Path(self.model).is_file():
                moe_layout, mla = moe_from_hf_config(self.model)
        return ModelSpec(dims, attention=self.attention, dropout=self.dropout, kernels=self.kernels,
                         moe=moe_layout, mla=mla)

    def _dims(self) -> ModelDims:
        if self.model and self.custom:
            raise ValueError("--model and custom dimensions (--layers, --hidden, ...) are exclusive")
        if self.model:
            if self.model.endswith(".json") or Path(self.model).is_file():  # a Hugging Face config.json
                return dims_from_hf_config(self.model)
            moe = get_moe_model(self.model)
            if moe is not None:
                return moe.dims
            try:
                return get_model(self.model)
            except ValueError as exc:
                raise ValueError(f"--model: {exc} (mixture-of-experts: {', '.join(sorted(MOE_MODELS))})") from None
        c = self.custom
        if c is None:
            raise ValueError("give --model PRESET or path/to/config.json, or all of --layers --hidden --heads "
                             "--ffn --vocab for a custom model")
        kv = c.kv_heads or c.heads
        if c.heads % kv or (c.head_dim is None and c.hidden % c.heads):
            raise ValueError(f"--hidden ({c.hidden}) must be divisible by --heads ({c.heads}) unless --head-dim is "
                             f"given, and --heads by --kv-heads ({kv})")
        return ModelDims("custom", c.hidden, c.ffn, c.layers, c.heads, kv, c.head_dim or c.hidden // c.heads,
                         c.vocab, self.seq_len or 4096, gated_mlp=c.gated, tied_embeddings=c.tied,
                         source="command line")

    def clusters(self) -> list[Cluster]:
        cals = tuple(load_calibration(p) for p in self.calibrations)
        hierarchical = self.hierarchical and self.profile()[0].hierarchical
        return [make_cluster(g, gpus_per_node=self.gpus_per_node, intra_gbps=self.intra_gbps,
                             inter_gbps=self.inter_gbps, intra_latency_us=self.intra_latency_us,
                             inter_latency_us=self.inter_latency_us, price_per_gpu_hour=self.price_per_gpu_hour,
                             power_fraction=self.power_fraction, calibrations=cals,
                             nics_per_node=self.nics_per_node, nic_gbits=self.nic_gbits,
                             hierarchical=hierarchical, hbm_gb=self.hbm_gb, hbm_tbps=self.hbm_tbps)
                for g in self.gpus]

    def training(self, spec: ModelSpec) -> Training:
        if self.seq_len is not None and self.seq_len < 1:
            raise ValueError(f"--seq-len must be >= 1, got {self.seq_len}")
        seq = self.seq_len or spec.dims.seq_len
        tokens = self.global_batch_tokens or max(seq, DEFAULT_BATCH_TOKENS // seq * seq)
        stated = {k: getattr(self, k) for k in ("attention_kernel", "tp_overlap", "cp_comm", "ep_overlap")
                  if getattr(self, k) is not None}
        return Training(global_batch_tokens=tokens, seq_len=seq, precision=self.precision, optimizer=self.optimizer,
                        grad_bytes=self.grad_bytes, micro_batch_sizes=tuple(self.micro_batch_sizes),
                        train_tokens=self.train_tokens, dp_overlap=self.dp_overlap, fsdp_gather=self.fsdp_gather,
                        offload_optimizer=self.offload_optimizer, moe_imbalance=self.moe_imbalance,
                        ep_dispatch=self.ep_dispatch,
                        memory_headroom=self.memory_headroom, **(self.profile()[0].training_fields() | stated))

    def efficiency(self, cluster: Cluster) -> Efficiency | None:
        """The constants for `cluster`: None (the calibrated defaults of its GPU), the command line's
        overrides, or with `calibrate` the constants measured in a results store (kernel_calibration.py);
        an override on the command line wins over a measurement."""
        base = self.profile()[0].efficiency(cluster.gpu.key)
        if self.calibrate:
            base = self.kernel_calibration(cluster).apply(base)
        elif self.gemm_eff is None and self.attn_eff is None and self.hbm_eff is None:
            return None
        if self.gemm_eff is None and self.attn_eff is None and self.hbm_eff is None:
            return base
        return replace(base, gemm=self.gemm_eff or base.gemm, attention=self.attn_eff or base.attention,
                       hbm=self.hbm_eff or base.hbm, attention_as_is=base.attention_as_is or self.attn_eff is not None,
                       source=f"{base.source}; command line overrides")

    def kernel_calibration(self, cluster: Cluster) -> KernelCalibration:
        if not self.calibrate:
            raise ValueError("no --calibrate store in this request")
        return load_kernel_calibration(self.calibrate, cluster.gpu.key)

    def constants_from(self, clusters: list[Cluster]) -> dict[str, Any]:
        """Where each constant of the cost model came from (the document's "constants_from")."""
        base = self.profile()[0].efficiency(clusters[0].gpu.key)
        kernels = {k: f"published: {base.source}" for k in ("gemm", "attention", "hbm")}
        if self.calibrate:
            kernels = self.kernel_calibration(clusters[0]).sources(base)
        for flag, k in (("gemm_eff", "gemm"), ("attn_eff", "attention"), ("hbm_eff", "hbm")):
            if getattr(self, flag) is not None:
                kernels[k] = f"command line (--{flag.replace('_', '-')})"
        kernels |= {k: f"published: {base.source}" for k in ("kernel_us", "fp8_gemm")}
        links = {}
        for c in clusters:
            cals = {cal.domain: cal for cal in c.calibrations}
            for domain, link in (("intra", c.intra), ("inter", c.inter)):
                cal = cals.get(domain)
                links[f"{c.label} {domain}"] = (f"measured: `wavefront comm` calibration ({cal.backend}, {cal.device}, "
                                                f"{cal.world_size} ranks, {cal.created_utc})" if cal else link.source)
        return {"kernels": kernels, "links": links}
