"""Per-kernel time: GEMMs from their shape, flash attention from (sequence, head_dim, causal), memory-bound
kernels from their bytes, FP8 casts. Pure arithmetic on the device table; numpy-free, torch-free.

GEMM C[M, N] = A[M, K] @ B[K, N] (one weight matmul of a layer, or one of its two backward matmuls):

    t = max(2 M N K / (peak x gemm x q), bytes / (HBM x hbm)) + kernel_us

- q, tile and wave quantization: the kernel covers C with ceil(M/Tm) x ceil(N/Tn) output tiles of
  Tm x Tn, run in waves of one tile per SM; q = (M N) / (tiles' area) x tiles / (waves x SMs). Tile
  128 x 128 on sm_80 (CUTLASS's default bf16 tile on A100), 128 x 256 on sm_90/sm_100 and the CDNA parts
  (the tile cuBLAS/hipBLASLt pick for large bf16 GEMMs on H100/MI300X: CUTLASS profiler listings, NVIDIA's
  "Matrix Multiplication Background" guide on tile and wave quantization);
- bytes: A, B and C read or written once (2 B per element in bf16, 1 B for fp8 operands), the intensity
  roof: small matrices run at bandwidth, not peak;
- kernel_us: a fixed cost per kernel launch and tail (Efficiency.kernel_us, fitted).

Flash attention, forward + backward of one layer: the causal square is half the FLOPs of the full one
(4 b s_q s_kv a d forward, x 2.5 for forward + backward: the backward recomputes QK^T and does four
matmuls), at Efficiency.attention x the sequence and head-dim curves below of the bf16 peak:

- sequence: s / (s + S_HALF_TOKENS) normalised to 1 at 16K, S_HALF_TOKENS = 512: the FlashAttention-2
  paper's fwd+bwd curves (Dao 2023, arXiv:2307.08691, Fig. 4-6, A100 d128 causal) rise from about 0.55 of
  their 16K value at 512 tokens to 0.9 at 4K; the causal blocks on the diagonal and the per-block fixed
  work are what a short sequence cannot amortise;
- the kernel (Training.attention_kernel): Efficiency.attention is the FlashAttention-2 class (flash-attn
  2, PyTorch SDPA's flash backend); on Hopper (sm_90) the cuDNN fused attention that Transformer Engine
  prefers there (NeMo's memory-optimization docs, NVIDIA/NeMo#9188) and FlashAttention-3 run the same
  FLOPs ATTENTION_KERNEL_SPEEDUP times faster. From the FlashAttention-3 paper's H100 SXM5 bf16 figures
  at head dim 128, 8K tokens (Fig. 5, causal forward: FA2 333, cuDNN 529, FA3 602 TFLOP/s; Fig. 6,
  backward: FA2 318, cuDNN 518, FA3 559), forward + backward (the backward 2.5x the forward's FLOPs):
  (1/333 + 2.5/318) / (1/529 + 2.5/518) = 1.62 for cuDNN and 1.77 for FA3 (1.60-1.62 and 1.75-1.78 from
  2K to 16K). On Blackwell (sm_100) cuDNN keeps the same factor: the B200 family's attention fraction is
  H100's transferred (training.PHYSICS_FAMILY), and cuDNN reaches about the same fraction of the bf16 peak
  on both parts (H100: 529 / 989 = 0.53 forward, above; B200: at least 1613 / 1.3 = 1241 of 2250 TFLOP/s =
  0.55 forward, since FlashAttention-4 reaches 1613 TFLOP/s and is at most 1.3x cuDNN 9.13 there, Zadouri et
  al. 2026, arXiv:2603.05451), and Transformer Engine prefers cuDNN on "Hopper+" (its backend selection).
  FA3 is Hopper-only, and Ampere has no published cuDNN-vs-FA2 figure used here: the factor is 1 there;
- head dim: d / (d + 32) normalised to 1 at d = 128 (d64 ~ 0.83x of d128, d256 ~ 1.11x: FA2 paper Fig. 4-6
  and FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608) Fig. 5, where d64 reaches about 0.8x of
  d128 and d256 about 1.1x).

FP8 (Transformer Engine / torchao float8 training): linear GEMMs run at the fp8 dense peak x gemm x
Efficiency.fp8_gemm (an fp8 GEMM reaches a smaller fraction of its doubled peak: 1.3-1.6x the bf16 GEMM
speed at large sizes rather than 2x, anchors.md), and every linear adds memory-bound cast kernels:
its input activation cast to fp8 with its amax (read 2 B, write 1 B) and the transposed fp8 copy the
backward weight-gradient GEMM needs (write 1 B): 4 B per input element forward; the output gradient the
same in backward (4 B per element); the weight cast (read 2 B, write 1 B, and 1 B transposed) once per
micro-batch, 4 B per weight element. Attention, norms and the output layer stay in bf16. The Megatron
stack (Transformer Engine's LayerNormLinear / LayerNormMLP and fused activation-cast kernels) writes the
fp8 copy from the norm or activation kernel that runs anyway, leaving only the transposed copy (1 B per
element) as extra traffic; the FSDP stacks (torchao float8 linear) cast in separate kernels.
"""

from __future__ import annotations

import math
from functools import cache

from wavefront.workbench.hardware import GPU

S_HALF_TOKENS = 512.0
S_REF_TOKENS = 16384.0
HEAD_DIM_KNEE = 32.0
#: Bytes of cast kernels per element: an fp8 linear's input (fwd) or output gradient (bwd), and a weight.
FP8_CAST_BYTES_PER_ACT = 4.0
FP8_CAST_BYTES_PER_WEIGHT = 4.0
FP8_FUSED_CAST_BYTES_PER_ACT = 1.0
#: Attention kernels (Training.attention_kernel) and their fwd+bwd speed on Hopper over FlashAttention-2
#: (module docstring: FlashAttention-3 paper, Figs. 5-6, H100 SXM5, d128, 8K tokens).
ATTENTION_KERNEL_SPEEDUP = {"fa2": 1.0, "cudnn": 1.62, "fa3": 1.77}


def attention_kernel_speedup(kernel: str, gpu: GPU) -> float:
    """How much faster than the FlashAttention-2 class `kernel` runs attention on `gpu`: every kernel on
    Hopper, cuDNN on Blackwell too (module docstring), 1 elsewhere."""
    if gpu.arch == "sm_90" or (gpu.arch == "sm_100" and kernel == "cudnn"):
        return ATTENTION_KERNEL_SPEEDUP[kernel]
    return 1.0


def gemm_tile(gpu: GPU) -> tuple[int, int]:
    return (128, 128) if gpu.arch == "sm_80" else (128, 256)


def wave_quantization(gpu: GPU, m: float, n: float) -> float:
    """Fraction of the SM-time that does useful work for an M x N output (module docstring)."""
    tm, tn = gemm_tile(gpu)
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tiles = tiles_m * tiles_n
    waves = math.ceil(tiles / gpu.sm_count)
    padding = (m * n) / (tiles_m * tm * tiles_n * tn)
    return padding * tiles / (waves * gpu.sm_count)


@cache
def gemm_s(gpu: GPU, m: int, n: int, k: int, peak_flops: float, hbm_bps: float, operand_bytes: float,
           kernel_s: float) -> float:
    """One GEMM's seconds: C[m, n] = A[m, k] B[k, n] at `peak_flops` (already x efficiency)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    compute = 2.0 * m * n * k / (peak_flops * wave_quantization(gpu, m, n))
    traffic = (operand_bytes * (m * k + k * n) + 2.0 * m * n) / hbm_bps
    return max(compute, traffic) + kernel_s


def linear_fwd_bwd_s(gpu: GPU, tokens: int, d_in: int, d_out: int, peak_flops: float, hbm_bps: float,
                     operand_bytes: float, kernel_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of Y[tokens, d_out] = X[tokens, d_in] W: backward is the input
    gradient (tokens x d_in over d_out) and the weight gradient (d_in x d_out over tokens)."""
    fwd = gemm_s(gpu, tokens, d_out, d_in, peak_flops, hbm_bps, operand_bytes, kernel_s)
    dgrad = gemm_s(gpu, tokens, d_in, d_out, peak_flops, hbm_bps, operand_bytes, kernel_s)
    wgrad = gemm_s(gpu, d_in, d_out, tokens, peak_flops, hbm_bps, operand_bytes, kernel_s)
    return fwd, dgrad + wgrad


def attention_curve(seq_kv: float, head_dim: int) -> float:
    """Relative flash-attention efficiency for a key length and head dim (1 at 16K tokens, d = 128)."""
    seq = seq_kv / (seq_kv + S_HALF_TOKENS) / (S_REF_TOKENS / (S_REF_TOKENS + S_HALF_TOKENS))
    dim = head_dim / (head_dim + HEAD_DIM_KNEE) / (128.0 / (128.0 + HEAD_DIM_KNEE))
    return seq * dim


def grouped_gemm_s(gpu: GPU, groups: int, m: float, n: int, k: float, peak_flops: float, hbm_bps: float,
                   operand_bytes: float, kernel_s: float) -> float:
    """One grouped GEMM (MoE experts): `groups` products C[m, n] = A[m, k] B[k, n] in one persistent kernel,
    priced with the GEMM shape model above. Tiles are padded per group (a group of m = 40 rows still
    fills a 128-row tile), the wave quantization counts all groups' tiles together (one scheduler over
    every group's tiles), and the bytes include every group's weights: with few tokens per expert the
    kernel is bound by reading the weights, which is how small per-expert GEMMs lose efficiency."""
    if groups <= 0 or m <= 0 or n <= 0 or k <= 0:
        return 0.0
    tm, tn = gemm_tile(gpu)
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tiles = groups * tiles_m * tiles_n
    waves = math.ceil(tiles / gpu.sm_count)
    quant = (m * n) / (tiles_m * tm * tiles_n * tn) * tiles / (waves * gpu.sm_count)
    compute = 2.0 * groups * m * n * k / (peak_flops * quant)
    traffic = groups * (operand_bytes * (m * k + k * n) + 2.0 * m * n) / hbm_bps
    return max(compute, traffic) + kernel_s


def grouped_linear_fwd_bwd_s(gpu: GPU, groups: int, rows: float, d_in: int, d_out: int, peak_flops: float,
                             hbm_bps: float, operand_bytes: float, kernel_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of `groups` experts' Y[rows, d_out] = X[rows, d_in] W_e, `rows` tokens
    each: forward, input gradient and per-expert weight gradient (d_in x d_out over rows)."""
    fwd = grouped_gemm_s(gpu, groups, rows, d_out, d_in, peak_flops, hbm_bps, operand_bytes, kernel_s)
    dgrad = grouped_gemm_s(gpu, groups, rows, d_in, d_out, peak_flops, hbm_bps, operand_bytes, kernel_s)
    wgrad = grouped_gemm_s(gpu, groups, d_in, d_out, rows, peak_flops, hbm_bps, operand_bytes, kernel_s)
    return fwd, dgrad + wgrad
