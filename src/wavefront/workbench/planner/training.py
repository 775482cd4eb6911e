"""Training settings and the efficiency constants of the cost model, each default with its source."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache

PRECISIONS = ("bf16", "fp8")

#: Bytes per parameter kept by each optimizer: (fp32 master copy, optimizer states). AdamW keeps an fp32
#: master weight and two fp32 moments (the 12 of ZeRO's 2 + 2 + 12 = 16 bytes per parameter, Rajbhandari
#: et al. 2020, arXiv:1910.02054, Sec. 3.1); "adamw-bf16" trains bf16 weights directly with bf16 moments
#: (no master copy); SGD with momentum keeps a master copy and one moment.
OPTIMIZER_BYTES = {"adamw": (4, 8), "adamw-bf16": (0, 4), "sgd": (4, 4)}


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the device peaks that the kernels of a training step reach.

    gemm: weight matmuls, of the dense peak for the precision. Default 0.75: calibrated on Narayanan et al.
        2021 Table 1 (Megatron-LM on A100, tests/data/published); best measured large bf16 matmuls reach
        0.87 of peak on A100 and 0.78-0.81 on H100/H200 (anchors.md, MAMF), so 0.75 sits just below them.
    attention: flash-attention core forward + backward, of the bf16 peak. Default 0.5: FlashAttention-2
        fwd+bwd at d128 reaches 203/312 = 0.65 on A100 and 338/989 = 0.34 on H100, FlashAttention-3 forward
        0.65 on H100 (anchors.md); 0.5 is between them.
    hbm: achieved fraction of HBM bandwidth for memory-bound kernels (norms, activations, optimizer).
        Default 0.9 (quack's RMSNorm/softmax/CE reach 0.90-0.95 of H100 HBM, anchors.md).
    Materialised attention (attention="materialized") runs its matmuls at `gemm` and streams the
    scores and softmax at `hbm`.
    """

    gemm: float = 0.75
    attention: float = 0.5
    hbm: float = 0.9
    source: str = "defaults (training.py: Efficiency)"

    def __post_init__(self) -> None:
        for name in ("gemm", "attention", "hbm"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"efficiency {name} must be in (0, 1], got {value}")

    def as_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def for_gpu(gpu_key: str) -> Efficiency:
        """The calibrated constants for a device-table GPU (CALIBRATED); others get the defaults."""
        return _for_gpu(gpu_key)


#: Per-GPU constants: weight-matmul efficiency fitted on published runs (tests/data/published; the fits and
#: the held-out errors are in docs/planner.md) and the measured FlashAttention-2 forward + backward
#: throughput at d128 (anchors.md: 203 of 312 TFLOP/s on A100, 338 of 989 on H100). H200 shares H100's
#: GH100 compute. Parts with no published run keep the Efficiency defaults and say so in their source.
CALIBRATED: dict[str, tuple[float, float, str]] = {
    "a100": (0.695, 0.65, "gemm fitted on Narayanan et al. 2021 Table 1 (A100); attention: FA2 on A100"),
    "h100": (0.615, 0.34, "gemm fitted on Llama 3 (Dubey et al. 2024) Table 4 row 1 (H100); attention: FA2 on H100"),
    "h200": (0.615, 0.34, "H100 constants (same GH100 compute)"),
}


@cache
def _for_gpu(gpu_key: str) -> Efficiency:
    if gpu_key in CALIBRATED:
        gemm, attention, source = CALIBRATED[gpu_key]
        return Efficiency(gemm=gemm, attention=attention, source=source)
    return Efficiency(source=f"defaults: no published run calibrates {gpu_key}")


@dataclass(frozen=True)
class Training:
    """What one optimizer step is, and the framework choices that change its cost.

    grad_bytes: bytes per gradient element in the accumulation buffer and the data-parallel reduction
        (4: fp32, Megatron's default main-grad buffer and FSDP2's reduce dtype; 2: bf16).
    dp_overlap: whether the data-parallel gradient reduction overlaps the last backward (DDP/FSDP buckets,
        Megatron --overlap-grad-reduce); False models a reduction after the backward (Megatron-LM 2021).
    tp_overlap: fraction of tensor-parallel communication hidden behind compute (0: none, the default;
        async TP / userbuffers overlap hides part of it).
    bucket_mb: DDP's bucket_cap_mb (25 MB default in torch); the last bucket cannot be hidden.
    framework_overhead_gb: CUDA context, NCCL buffers and workspace (training-math.md: about 1-3 GB).
    allocator_slack: fraction added to activation and transient memory for caching-allocator
        fragmentation (reserved vs allocated).
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
    tp_overlap: float = 0.0
    bucket_mb: float = 25.0
    framework_overhead_gb: float = 2.0
    allocator_slack: float = 0.05
    zero3_16bit_shard: bool = False

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.global_batch_tokens < self.seq_len:
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be >= seq_len "
                             f"({self.seq_len}) >= 1")
        if self.global_batch_tokens % self.seq_len:
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be a multiple of "
                             f"seq_len ({self.seq_len})")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.optimizer not in OPTIMIZER_BYTES:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_BYTES)}, got {self.optimizer!r}")
        if self.grad_bytes not in (2, 4):
            raise ValueError(f"grad_bytes must be 2 or 4, got {self.grad_bytes}")
        if not self.micro_batch_sizes or min(self.micro_batch_sizes) < 1:
            raise ValueError(f"micro_batch_sizes must be positive integers, got {self.micro_batch_sizes}")
        if not 0.0 <= self.tp_overlap <= 1.0:
            raise ValueError(f"tp_overlap must be in [0, 1], got {self.tp_overlap}")
        if self.train_tokens <= 0 or self.bucket_mb <= 0 or self.framework_overhead_gb < 0 or self.allocator_slack < 0:
            raise ValueError("train_tokens and bucket_mb must be > 0; overheads must be >= 0")

    @property
    def global_batch_seqs(self) -> int:
        return self.global_batch_tokens // self.seq_len

    def as_dict(self) -> dict:
        return asdict(self) | {"global_batch_seqs": self.global_batch_seqs}
