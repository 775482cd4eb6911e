"""Training settings and the efficiency constants of the cost model, each default with its source."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

PRECISIONS = ("bf16", "fp8")
#: Kernel families of the software stacks (Training.stack, set by a stack profile, stacks.py): "megatron"
#: (Transformer Engine: FP8 casts fused into the norm and activation kernels) and "fsdp" (PyTorch-native:
#: separate cast kernels). What each stack's kernels reach is the profile's constants, not this field.
STACKS = ("megatron", "fsdp")
#: When ZeRO-3 / FSDP gathers the weights: "micro-batch" (reshard after forward: two all-gathers and one
#: reduce-scatter per micro-batch: FSDP2's default, DeepSpeed ZeRO-3); "no-reshard" (the forward's gathered
#: weights stay for the backward: one all-gather per micro-batch, +2 B per stage parameter: FSDP2
#: reshard_after_forward=False, torchtitan with PP); "step" (gather and reduce once per step, unsharded
#: weights and gradients kept across micro-batches: +(2 + grad) B per parameter).
FSDP_GATHER = ("micro-batch", "no-reshard", "step")
#: What ZeRO-3 gathers at a time: "layer" (FSDP2 wraps each transformer block: a whole layer's weights
#: gathered, the next prefetched) or "sub-module" (DeepSpeed ZeRO-3 hooks every nn.Module that owns
#: parameters, so the largest single weight matrix is the unit; memory.py).
ZERO3_UNITS = ("layer", "sub-module")
#: How context parallelism exchanges K and V: "ring" (P2P ring attention with per-step merges: Transformer
#: Engine's default cp_comm_type "p2p", Megatron-LM, torchtitan) or "all-gather" (gather K and V, then one
#: attention of the local queries over them: Llama 3, Dubey et al. 2024, Sec. 3.3.2; TE "all_gather").
CP_COMM = ("ring", "all-gather")
#: Attention kernel classes (kernels.ATTENTION_KERNEL_SPEEDUP): "fa2" (flash-attn 2, PyTorch SDPA's flash
#: backend; what Efficiency.attention is fitted as), "cudnn" (Transformer Engine's default on Hopper), "fa3".
ATTENTION_KERNELS = ("fa2", "cudnn", "fa3")
#: How the loss holds the logits (memory.loss_activation_bytes): "vocab-parallel" (Megatron's fused
#: vocab-parallel cross-entropy: fp32 logits 4sbV/t, Korthikanti et al. 2022 Sec. 4.2.2), "native" (PyTorch's
#: F.cross_entropy on logits cast to fp32, torchtitan: bf16 logits + fp32 copy + fp32 log-softmax, 10sbV/t at
#: the loss), "fused" (a fused LM-head + cross-entropy that never forms the logits: wavefront's own).
LOSS_LOGITS = ("vocab-parallel", "native", "fused")
#: Expert-parallel dispatch across nodes: "all-to-all" (every token copy goes to its expert's GPU, NCCL
#: all-to-all) or "deepep" (DeepEP's normal kernels: a token crosses to each node holding one of its
#: experts once, then NVLink forwards it to the GPUs there: DeepSeek-V3 report, arXiv:2412.19437, Sec. 3.2.2).
EP_DISPATCH = ("all-to-all", "deepep")

#: What recompute="selective" reruns, by module, as Megatron-Core's --recompute-modules names them (with
#: --recompute-granularity selective): "core_attn" the attention core (the default, Korthikanti et al.'s
#: selective recomputation), "mla_up_proj" the MLA up-projections and RoPE (their Q, K, V freed after the
#: attention's forward), "mlp" a dense layer's MLP (not a MoE layer's), "moe_act" the experts' activation
#: function. Megatron-Core's "layernorm", "moe" and "shared_experts" are not modelled.
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe_act")

#: Bytes per parameter kept by each optimizer: (fp32 master copy, optimizer states). AdamW keeps an fp32
#: master weight and two fp32 moments (the 12 of ZeRO's 2 + 2 + 12 = 16 bytes per parameter, Rajbhandari
#: et al. 2020, arXiv:1910.02054, Sec. 3.1); "adamw-bf16" trains bf16 weights directly with bf16 moments
#: (no master copy); SGD with momentum keeps a master copy and one moment.
OPTIMIZER_BYTES = {"adamw": (4, 8), "adamw-bf16": (0, 4), "sgd": (4, 4)}


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the device peaks that the kernels of a training step reach.

    gemm: the fraction of the dense peak a large weight GEMM reaches (kernels.py applies tile and wave
        quantization and the bandwidth roof on top). Default 0.75; best measured large bf16 matmuls reach
        0.87 of peak on A100 and 0.78-0.81 on H100/H200 (anchors.md, MAMF). Fitted per GPU family.
    attention: flash-attention core forward + backward at 16K tokens and d128, of the bf16 peak (kernels.py
        scales it by sequence and head dim). Default 0.5: FlashAttention-2 fwd+bwd at d128 reaches
        203/312 = 0.65 on A100 and 338/989 = 0.34 on H100 (anchors.md). Fitted per GPU family.
    hbm: achieved fraction of HBM bandwidth for memory-bound kernels (norms, activations, optimizer,
        fp8 casts). 0.9, not fitted (quack's RMSNorm/softmax/CE reach 0.90-0.95 of H100 HBM, anchors.md).
    kernel_us: fixed microseconds per kernel (launch and tail), fitted (the fit drives it to ~0: the
        shape terms already explain small models).
    fp8_gemm: fp8 GEMMs reach gemm x fp8_gemm of the fp8 peak, fitted.
    fsdp_stack: multiplier on gemm and attention for Training.stack = "fsdp" (1.0: a stack profile's
        constants are its own, stacks.py).
    moe_layer_us: fixed microseconds per MoE layer and forward pass beyond its kernels (the backward pays
        it twice): the dispatcher copies the token counts per expert to the host to size the grouped GEMMs
        and the all-to-all, a synchronisation that drains the launch queue, plus the per-expert bookkeeping.
        Paid with Training.moe_capacity_factor set too: padding to capacity removes the copy (Megatron-Core's
        drop-and-pad path has static splits) but the fitted value, about a millisecond, is far more than one
        synchronisation, so most of it is the rest of the per-layer overhead. Physics default 0 (no
        benchmark isolates it); a stack profile fits it on its own MoE calibration rows.
    attention_as_is: `attention` is what the run's own kernel reaches (measured with --calibrate, or given
        with --attn-eff), so Training.attention_kernel's class factor does not apply on top of it.
    Materialised attention (attention="materialized") runs its matmuls at `gemm` and streams the
    scores and softmax at `hbm`.
    """

    gemm: float = 0.75
    attention: float = 0.5
    hbm: float = 0.9
    kernel_us: float = 4.0
    fp8_gemm: float = 0.75
    fsdp_stack: float = 1.0
    moe_layer_us: float = 0.0
    attention_as_is: bool = False
    source: str = "defaults (training.py: Efficiency)"

    def __post_init__(self) -> None:
        if not 0.0 <= self.kernel_us <= 1000.0:
            raise ValueError(f"kernel_us must be in [0, 1000], got {self.kernel_us}")
        if not 0.0 <= self.moe_layer_us <= 1e5:
            raise ValueError(f"moe_layer_us must be in [0, 1e5], got {self.moe_layer_us}")
        for name in ("gemm", "attention", "hbm", "fp8_gemm", "fsdp_stack"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"efficiency {name} must be in (0, 1], got {value}")

    def stack_factor(self, stack: str) -> float:
        """Multiplier on the matmul and attention efficiencies for a software stack (Training.stack)."""
        return self.fsdp_stack if stack == "fsdp" else 1.0

    @staticmethod
    def for_gpu(gpu_key: str) -> Efficiency:
        """The physics defaults for a device-table GPU (PHYSICS_FAMILY, FAMILY_OF); others get the class
        defaults. A stack profile's fitted constants: stacks.get_profile(name).efficiency(gpu_key)."""
        return _for_gpu(gpu_key)


#: Physics defaults: what the best measured kernels reach, per GPU family, from published kernel benchmarks
#: (/anchors: stas00's MAMF tables for the largest bf16 matmul, the FlashAttention-2 paper/README for its
#: forward + backward at 16K tokens, d128), not fitted on any training run. A software-stack profile
#: (stacks.py) that has no calibration rows of its own prices with these, and says so.
#:   gemm: H100 794 / 989 = 0.803 (H200 769-798 measured); A100 271 / 312 = 0.869.
#:   attention: FlashAttention-2 fwd+bwd 338 / 989 = 0.342 (H100); 203 / 312 = 0.651 (A100).
#:   fp8_gemm: fp8 GEMMs reach 1.5-1.9x bf16 on H100 (per-GEMM speed-ups, /anchors), 1.7 / 2 = 0.85 of the
#:   doubled peak relative to gemm.
#:   kernel_us: 4 us per kernel, launch and tail (Efficiency's default, not fitted).
#:   moe_layer_us: 0 (Efficiency.moe_layer_us: no benchmark isolates the dispatcher's host sync).
#: B200 and GB200 (the "b200" family: a profile fits it apart from H100's, since Blackwell reaches its own
#: fraction of a different peak) start from the H100 fractions: no anchor of their own, transferred.
PHYSICS_FAMILY = {
    "a100": {"gemm": 0.869, "attention": 0.651},
    "h100": {"gemm": 0.803, "attention": 0.342},
    "b200": {"gemm": 0.803, "attention": 0.342},
}
PHYSICS_SHARED = {"kernel_us": 4.0, "fp8_gemm": 0.85, "moe_layer_us": 0.0}
#: Device-table GPU -> the family whose constants (physics defaults, or a profile's fit) it uses, and why.
FAMILY_OF: dict[str, tuple[str, str]] = {
    "a100": ("a100", "A100"),
    "a100-40gb": ("a100", "A100 family (same GA100 compute)"),
    "h100": ("h100", "H100"),
    "h200": ("h100", "H100 family (same GH100 compute)"),
    "h100-pcie": ("h100", "H100 family (GH100 at PCIe clocks: the lower peak is in the device table)"),
    "h100-nvl": ("h100", "H100 family (GH100 at NVL clocks: the lower peak is in the device table)"),
    "gb200": ("b200", "B200 family (H100 physics fractions transferred, not measured)"),
    "b200": ("b200", "B200 family (H100 physics fractions transferred, not measured)"),
}


@cache
def _for_gpu(gpu_key: str) -> Efficiency:
    if gpu_key in FAMILY_OF:
        family, why = FAMILY_OF[gpu_key]
        fam = PHYSICS_FAMILY[family]
        return Efficiency(gemm=fam["gemm"], attention=fam["attention"], kernel_us=PHYSICS_SHARED["kernel_us"],
                          moe_layer_us=PHYSICS_SHARED["moe_layer_us"],
                          fp8_gemm=PHYSICS_SHARED["fp8_gemm"],
                          source=f"physics defaults (training.PHYSICS_FAMILY: {why}; kernel benchmarks, not fitted)")
    return Efficiency(kernel_us=PHYSICS_SHARED["kernel_us"], fp8_gemm=PHYSICS_SHARED["fp8_gemm"],
                      source=f"defaults: no kernel benchmark or published run calibrates {gpu_key}")


#: Default fraction of the TP/SP all-gathers and reduce-scatters hidden behind the GEMMs. Today's stacks
#: overlap them: Transformer Engine's userbuffers overlap (Megatron-LM --tp-comm-overlap; NeMo and
#: Megatron-Bridge enable it in their H100 recipes, NVIDIA-NeMo/Megatron-Bridge#2247) runs the dependency-free
#: collectives in bulk under other GEMMs and pipelines the dependent ones in chunks, exposing one chunk (NeMo
#: docs, "Communication Overlap"); PyTorch async TP decomposes each all-gather-matmul into tp ring steps.
#: What they hide, measured: torchtitan's async-TP benchmark (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md)
#: speeds Llama 3.1 70B TP8 FSDP32 (full AC) up 1.09x and 8B TP8 FSDP8 (per-op AC) 1.10x in bf16, which with
#: this model's TP shares of those steps (18% and 22%) is 45% and 41% of the TP time hidden; nanotron's
#: DoMiNO reports 62% (75% forward, 50% backward; huggingface/nanotron#284). 0.5 is the middle of that range.
TP_OVERLAP = 0.5


@dataclass(frozen=True)
class Training:
    """What one optimizer step is, and the framework choices that change its cost.

    grad_bytes: bytes per gradient element in the accumulation buffer and the data-parallel reduction
        (4: fp32, Megatron's default main-grad buffer and FSDP2's reduce dtype; 2: bf16).
    dp_overlap: whether the data-parallel gradient reduction overlaps the last backward (DDP/FSDP buckets,
        Megatron --overlap-grad-reduce); False models a reduction after the backward (Megatron-LM 2021).
    tp_overlap: fraction of tensor-parallel communication hidden behind compute. Default TP_OVERLAP (0.5):
        what the stacks people run hide (see TP_OVERLAP); 0 for a stack with the collectives on the critical
        path (Megatron-LM 2021, vanilla torchtitan TP), 1 for the ideal.
    bucket_mib: DDP's bucket_cap_mb, in MiB (torch reads bucket_cap_mb as MiB: 25 by default); the last
        bucket cannot be hidden. (The planner used to read it as 10^6 bytes while the DDP model read MiB.)
    framework_overhead_gb: CUDA context, NCCL buffers and workspace (training-math.md: about 1-3 GB).
    allocator_slack: the caching allocator's fragmentation (reserved over allocated), as a fraction of the
        activation and transient memory it churns: the one place fragmentation is counted
        (memory.allocator_bytes; an assumption, no published figure sizes it).
    loss_logits: how the loss holds the logits (LOSS_LOGITS; memory only).
    memory_headroom: fraction of the device memory the search admits a plan to use (default 0.90): the
        margin for the memory model's own error and what it leaves out (torch.compile and fp8 workspaces,
        NCCL's buffers growing with the communicators), not for fragmentation, which allocator_slack counts
        once inside the total. 0.90 (kept from before): the model reads 11.6% under torchtitan's published
        reserved peaks (held-out median, docs/planner.md). 1.0 admits up to the full device.
    stack: the kernel family, "megatron" or "fsdp" (STACKS), from the stack profile.
    fsdp_gather: when ZeRO-3 gathers weights (FSDP_GATHER).
    zero3_unit: what ZeRO-3 gathers at a time (ZERO3_UNITS): "layer" (FSDP2) or "sub-module" (DeepSpeed).
    offload_optimizer: optimizer states and master weights live in host memory and the update runs on the
        CPU (time.PCIE_GBPS, time.CPU_ADAM_PARAMS_PER_S).
    cp_comm: how context parallelism moves K and V (CP_COMM).
    attention_kernel: the flash-attention kernel class (ATTENTION_KERNELS): "fa2" by default; the Megatron
        stacks with Transformer Engine run "cudnn" on Hopper; only Hopper prices them differently.
    moe_imbalance: tokens of the busiest expert over the mean (MoE; 1.0 = perfectly balanced, as the
        force-balanced benchmark tables run). The busiest EP rank's grouped GEMMs, activations and
        all-to-all bytes scale by it: the step waits for that rank.
    moe_capacity_factor: expert capacity as a multiple of the mean tokens per expert (GShard, Switch;
        Megatron-Core --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity): the busiest
        rank runs exactly that many rows (tokens beyond it dropped, experts below it padded), whatever the
        imbalance. None (default): dropless, the busiest rank runs moe_imbalance x the mean (moe_rows_factor).
    ep_overlap: fraction of the expert-parallel all-to-alls hidden behind compute (0: exposed, the plain
        all-to-all dispatcher; DeepSeek-V3's DualPipe and Megatron's 1F1B A2A overlap hide most of it).
    op_recompute_mm: fraction of a layer's weight-matmul forward that recompute="op" runs again (0: every
        matmul output saved, `wavefront train`'s policy; 0.5: torchtitan's per-op policy, which marks every
        second mm/linear PREFER_RECOMPUTE); a fact of the stack profile (stacks.py).
    recompute_early_stop: the stack checkpoints with PyTorch's non-reentrant torch.utils.checkpoint, which
        (PyTorch >= 2.1, `set_checkpoint_early_stop`, on by default) ends the recomputation once the last
        tensor the backward needs is saved. Autograd saves an aten matmul's inputs before it runs, so in a
        bf16 dense block the last matmul (the MLP down projection), its TP reduction and the residual add
        after it are not rerun: full recomputation reruns the forward less that matmul. Not for fp8 linears
        (autograd Functions that save after their GEMM) nor MoE layers (the weighted combine saves the expert
        outputs); reentrant checkpointing (Megatron-LM's, DeepSpeed's, TE's) reruns the whole forward. A fact
        of the stack profile (stacks.py).
    ep_dispatch: how the expert-parallel all-to-all crosses nodes (EP_DISPATCH).
    recompute_modules: what a plan with recompute="selective" reruns (RECOMPUTE_MODULES; default the
        attention core only).
    offload_activation_layers: layers whose saved activations are copied to host memory after their forward
        and back before their backward (Megatron-Core --cpu-offloading-num-layers; Megatron-Bridge's GB200
        FSDP recipes offload 40 of Llama 3 70B's 80 layers and 92 of 405B's 126). memory.py keeps the other
        layers and one layer in transfer on the GPU; time.py charges what the host link cannot hide under
        the compute it overlaps. Modelled with pp = 1 (parallel.structural_problems).
    pp_round: micro-batches per round of the interleaved pipeline schedule (pipeline.py): 0 (default) is
        pp, Megatron-LM's; Llama 3's schedule makes it tunable (Dubey et al. 2024, Sec. 3.3.2). Memory
        only: the time model keeps the (pp - 1)/(vpp m) bubble, which does not hold for a round below pp.
    zero3_16bit_shard: ZeRO-3 keeps a sharded 16-bit working copy of the parameters besides the fp32
        master (DeepSpeed, and the ZeRO paper's (2 + 2 + K) psi / Nd); False (default) is FSDP2, where the
        fp32 sharded parameter is the master and the 16-bit copy exists only while gathered.
    """

    global_batch_tokens: int
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adamw"
    grad_bytes: int = 4
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    train_tokens: float = 1e12
    dp_overlap: bool = True
    tp_overlap: float = TP_OVERLAP
    bucket_mib: float = 25.0
    framework_overhead_gb: float = 2.0
    allocator_slack: float = 0.05
    memory_headroom: float = 0.90
    loss_logits: str = "vocab-parallel"
    zero3_16bit_shard: bool = False
    stack: str = "megatron"
    fsdp_gather: str = "micro-batch"
    zero3_unit: str = "layer"
    offload_optimizer: bool = False
    cp_comm: str = "ring"
    moe_imbalance: float = 1.0
    moe_capacity_factor: float | None = None
    ep_overlap: float = 0.0
    op_recompute_mm: float = 0.0
    recompute_early_stop: bool = False
    attention_kernel: str = "fa2"
    pp_round: int = 0
    ep_dispatch: str = "all-to-all"
    recompute_modules: tuple[str, ...] = ("core_attn",)
    offload_activation_layers: int = 0

    def __post_init__(self) -> None:
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention_kernel must be one of {ATTENTION_KERNELS}, got {self.attention_kernel!r}")
        if self.moe_imbalance < 1.0:
            raise ValueError(f"moe_imbalance must be >= 1 (busiest expert over the mean), got {self.moe_imbalance}")
        if self.moe_capacity_factor is not None and self.moe_capacity_factor <= 0.0:
            raise ValueError(f"moe_capacity_factor must be > 0 (a multiple of the mean tokens per expert), "
                             f"got {self.moe_capacity_factor}")
        bad = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if bad or not self.recompute_modules or len(set(self.recompute_modules)) != len(self.recompute_modules):
            raise ValueError(f"recompute_modules must be distinct names from {RECOMPUTE_MODULES}, got "
                             f"{list(self.recompute_modules)}")
        if self.ep_dispatch not in EP_DISPATCH:
            raise ValueError(f"ep_dispatch must be one of {EP_DISPATCH}, got {self.ep_dispatch!r}")
        if self.offload_activation_layers < 0:
            raise ValueError(f"offload_activation_layers must be >= 0 (layers whose activations go to the host), "
                             f"got {self.offload_activation_layers}")
        if self.pp_round < 0:
            raise ValueError(f"pp_round must be >= 0 (0: pp micro-batches per round), got {self.pp_round}")
        if not 0.0 <= self.op_recompute_mm <= 1.0:
            raise ValueError(f"op_recompute_mm must be in [0, 1], got {self.op_recompute_mm}")
        if not 0.0 <= self.ep_overlap <= 1.0:
            raise ValueError(f"ep_overlap must be in [0, 1], got {self.ep_overlap}")
        if self.cp_comm not in CP_COMM:
            raise ValueError(f"cp_comm must be one of {CP_COMM}, got {self.cp_comm!r}")
        if self.zero3_unit not in ZERO3_UNITS:
            raise ValueError(f"zero3_unit must be one of {ZERO3_UNITS}, got {self.zero3_unit!r}")
        if self.fsdp_gather not in FSDP_GATHER:
            raise ValueError(f"fsdp_gather must be one of {FSDP_GATHER}, got {self.fsdp_gather!r}")
        if self.stack not in STACKS:
            raise ValueError(f"stack must be one of {STACKS}, got {self.stack!r}")
        if self.seq_len < 1 or self.global_batch_tokens < self.seq_len:
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be >= seq_len "
                             f"({self.seq_len}) >= 1")
        if self.global_batch_tokens % self.seq_len:
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be a multiple of "
                             f"seq_len ({self.seq_len})")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.loss_logits not in LOSS_LOGITS:
            raise ValueError(f"loss_logits must be one of {LOSS_LOGITS}, got {self.loss_logits!r}")
        if self.optimizer not in OPTIMIZER_BYTES:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_BYTES)}, got {self.optimizer!r}")
        if self.grad_bytes not in (2, 4):
            raise ValueError(f"grad_bytes must be 2 or 4, got {self.grad_bytes}")
        if not self.micro_batch_sizes or min(self.micro_batch_sizes) < 1:
            raise ValueError(f"micro_batch_sizes must be positive integers, got {self.micro_batch_sizes}")
        if not 0.0 <= self.tp_overlap <= 1.0:
            raise ValueError(f"tp_overlap must be in [0, 1], got {self.tp_overlap}")
        if not 0.0 < self.memory_headroom <= 1.0:
            raise ValueError(f"memory_headroom must be in (0, 1] (fraction of device memory usable), "
                             f"got {self.memory_headroom}")
        if self.train_tokens <= 0 or self.bucket_mib <= 0 or self.framework_overhead_gb < 0 or self.allocator_slack < 0:
            raise ValueError("train_tokens and bucket_mib must be > 0; overheads must be >= 0")

    @property
    def moe_rows_factor(self) -> float:
        """Rows of the busiest EP rank over the mean: the capacity when tokens are capped and padded to it,
        else the load imbalance (dropless)."""
        return self.moe_imbalance if self.moe_capacity_factor is None else self.moe_capacity_factor

    @property
    def global_batch_seqs(self) -> int:
        return self.global_batch_tokens // self.seq_len

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"global_batch_seqs": self.global_batch_seqs}
