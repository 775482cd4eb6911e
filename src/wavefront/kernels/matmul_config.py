"""Launch configurations of the matrix-unit kernels (attention and the GEMM behind linear): data, and pure
functions that pick from it.

One FamilyTable (kernels/_tables.py) per kernel kind, over the architecture families (``nvidia``,
``amd-cdna``, ``amd-rdna``, and ``cpu`` for the interpreter; the TMA tables over NVIDIA's generations): the
default row, and a family's own row only where its compile measured otherwise. Each entry is a tile shape,
launch options, and the reason it is there. The reasons quote
what the ahead-of-time compiled kernel showed for bf16 at that entry (registers per thread, spills, shared
memory/LDS, matrix instruction; ``tests/ops/test_matrix_instructions.py`` re-checks them, and
docs/kernels-attention-gemm.md has the full table). No entry carries a GPU timing: none was measured on
this project's machines yet, so among spill-free shapes the choice follows the published practice named
in the reason (FlashAttention-2/Triton tutorial tiles on NVIDIA, AMD's Triton attention and GEMM tuning
guides on CDNA) and would be refined by timing the short candidate lists on a GPU.

16-bit inputs use the entries as listed. fp32 inputs (accepted for testing) double every operand tile,
so the picker halves the tiles that the dtype doubles (attention: BLOCK_M and BLOCK_N; GEMM: BLOCK_K),
keeping shared memory at the verified 16-bit footprint.

AMD-only launch options (``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``) are emitted by
:meth:`TileConfig.options` only for AMD families: the NVIDIA compiler and the interpreter reject them.

MI300X (gfx942) has 8 XCDs, each with a private 4 MB L2, and the dispatcher hands workgroup ``p`` to XCD
``p % 8``. :data:`XCDS` feeds the program-order remap in ``kernels/_program_order.py`` so that programs
sharing a K/V head (attention) or an A row panel (GEMM) run on the same XCD.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import torch

from wavefront.kernels._tables import Differs, FamilyTable
from wavefront.runtime import Arch

#: Accelerator complex dies per device: the XCD remap is the identity elsewhere.
XCDS: dict[str, int] = {"gfx942": 8}


@dataclass(frozen=True)
class TileConfig:
    """One tuned entry. BLOCK_K is the GEMM reduction tile (0 for attention, which reduces over the
    whole head dim in one dot); GROUP_M the GEMM's grouped-ordering height (programs sharing a B panel)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    reason: str
    BLOCK_K: int = 0
    GROUP_M: int = 1
    waves_per_eu: int = 0
    matrix_instr_nonkdim: int = 0
    kpack: int = 1
    warp_specialize: bool = False  # GEMM TMA kernels: producer/consumer warp specialization

    def options(self, arch: Arch) -> dict:
        """Launch options for `arch`: AMD extras only on AMD targets."""
        return matrix_launch_options(self, arch)


def matrix_launch_options(cfg, arch: Arch) -> dict:
    """Launch options of a matrix-unit kernel config (TileConfig, AttentionConfig) for `arch`: the AMD
    extras only on AMD targets (the NVIDIA compiler and the interpreter reject them)."""
    opts = {"num_warps": min(cfg.num_warps, arch.max_num_warps), "num_stages": cfg.num_stages}
    if arch.family in ("amd-cdna", "amd-rdna"):
        opts["waves_per_eu"] = cfg.waves_per_eu
    if arch.family == "amd-cdna":
        opts["matrix_instr_nonkdim"] = cfg.matrix_instr_nonkdim
        opts["kpack"] = cfg.kpack
    return opts


_T = TileConfig


# ---------------------------------------------------------------------------------------------------
# GEMM (linear forward, and the dx and dweight products of its backward). Two tables, "light" (no epilogue or
# a bias) and "heavy" (an activation and its derivative in the epilogue, a residual tile read in the epilogue,
# or the backward's scaled-A prologue and transposed operands), each a FamilyTable whose row is the family's
# list of (min M, entry): the first entry whose min M the problem reaches, so decode-sized problems get short
# tiles instead of masked ones. NVIDIA's lists are the default; every other family's own list exists because
# its matrix unit and register file measured differently (each entry's reason). Register counts are from the
# compiled kernels at bf16 with Triton's own specialization (AMD: buffer instructions for tensors under 2 GiB).

GemmRow = tuple[tuple[int, TileConfig], ...]

_INTERPRETER = "interpreter: several tiles per test matrix"
#: The interpreter's entry for every GEMM product: small tiles so small test matrices cross several blocks in
#: M, N and K.
_CPU_GEMM: GemmRow = ((1, _T(32, 32, 4, 1, _INTERPRETER, BLOCK_K=16, GROUP_M=2)),)

GEMM_TABLES: dict[str, FamilyTable[GemmRow]] = {
    "light": FamilyTable(
        (
            (256, _T(128, 256, 8, 3, "128x256x64, two warpgroups, wgmma n256 (the Triton matmul tutorial's Hopper "
                                     "shape): 174 regs, 0 spill, 144 KiB on sm_90; sm_80 255 regs", BLOCK_K=64,
                     GROUP_M=8)),
            (64, _T(64, 128, 4, 4, "64x128x64 for a few hundred rows: more programs than 128x256", BLOCK_K=64,
                    GROUP_M=8)),
            (1, _T(16, 128, 4, 4, "decode-sized M: 16-row tiles waste no MMA rows beyond the minimum", BLOCK_K=128,
                   GROUP_M=1)),
        ),
        "NVIDIA (sm_80/90/100): mma.sync / wgmma / tcgen05 tiles, each entry's compile in its reason",
        {
            "amd-cdna": Differs("MFMA 16x16, kpack 2, 2 LDS stages (AMD's MI300X GEMM tuning guide), 304 CUs", row=(
                (256, _T(256, 256, 8, 2, "256x256x32, 8 waves, mfma16, kpack 2, num_stages 2 (AMD's MI300X GEMM "
                                         "tuning starting point): 206 VGPRs, 0 spill, 32 KiB LDS", BLOCK_K=32,
                         GROUP_M=4, matrix_instr_nonkdim=16, kpack=2)),
                (64, _T(64, 128, 4, 2, "64x128x64 for a few hundred rows: more workgroups over 304 CUs", BLOCK_K=64,
                        GROUP_M=4, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)),
                (1, _T(16, 128, 4, 2, "decode-sized M: 16-row tiles (the MFMA 16x16 minimum)", BLOCK_K=128,
                       GROUP_M=1, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)),
            )),
            "amd-rdna": Differs("WMMA 16x16x16 on wave32 (gfx1100): 128-row tiles from 128 rows, 64x64 below", row=(
                (128, _T(128, 128, 8, 2, "128x128x32, 8 wave32s, WMMA 16x16x16: 151 VGPRs, 16 KiB LDS", BLOCK_K=32,
                         GROUP_M=8)),
                (1, _T(64, 64, 4, 2, "small M: 64x64x32, 133 VGPRs", BLOCK_K=32, GROUP_M=1)),
            )),
            "cpu": Differs(_INTERPRETER, row=_CPU_GEMM),
        },
    ),
    "heavy": FamilyTable(
        (
            (256, _T(128, 128, 8, 4, "128x128x32: 128x256 spills 528 B with a gelu epilogue on sm_90, 120 B with a "
                                     "residual on sm_100, and ptxas spills 4 KB in the backward on sm_80; this "
                                     "shape is 0 spill on sm_80/90/100 (sm_80 gelu: 254 regs)", BLOCK_K=32,
                     GROUP_M=8)),
            (64, _T(64, 128, 4, 4, "64x128x32 for a few hundred rows", BLOCK_K=32, GROUP_M=8)),
            (1, _T(16, 128, 4, 4, "decode-sized M", BLOCK_K=64, GROUP_M=1)),
        ),
        "NVIDIA (sm_80/90/100): the light tiles spill with an epilogue or in the backward (first entry's reason)",
        {
            "amd-cdna": Differs("MFMA 16x16, kpack 2, waves_per_eu 2: 256x256 spills with gelu on gfx90a", row=(
                (256, _T(128, 128, 8, 2, "128x128x32, waves_per_eu 2: 256x256 spills with gelu and BLOCK_K 64 "
                                         "spills 68 B in the backward on gfx90a; this is 150-160 VGPRs, 0 spill, "
                                         "16-24 KiB LDS", BLOCK_K=32, GROUP_M=4, waves_per_eu=2,
                         matrix_instr_nonkdim=16, kpack=2)),
                (64, _T(64, 128, 4, 2, "64x128x32 for a few hundred rows", BLOCK_K=32, GROUP_M=4, waves_per_eu=2,
                        matrix_instr_nonkdim=16, kpack=2)),
                (1, _T(16, 128, 4, 2, "decode-sized M", BLOCK_K=64, GROUP_M=1, waves_per_eu=2,
                       matrix_instr_nonkdim=16, kpack=2)),
            )),
            "amd-rdna": Differs("WMMA 16x16x16 on wave32 (gfx1100): the light tiles, 0 spill with every epilogue", row=(
                (128, _T(128, 128, 8, 2, "128x128x32: gelu epilogue 236 VGPRs, residual 169, backward 175-207, 0 "
                                         "spill", BLOCK_K=32, GROUP_M=8)),
                (1, _T(64, 64, 4, 2, "small M: 64x64x32, backward 175 VGPRs", BLOCK_K=32, GROUP_M=1)),
            )),
            "cpu": Differs(_INTERPRETER, row=_CPU_GEMM),
        },
    ),
}


#: Families whose backward products take reduction-contiguous copies of their transposed operands (dx: W^T;
#: dW: (dy * act'(z))^T formed in one pass, and x^T). Measured on gfx942 and gfx90a at bf16 with Triton 3.9: an
#: operand whose reduction dim is strided reaches the MFMA through ds_read_u16 (dx: 32-80, dW: 96-97 per
#: kernel, 16 MFMA against 48 ds_read_u16 per k-step), for every kpack, nonkdim and load orientation tried, the
#: in-thread-transpose pass notwithstanding; with the copies every LDS read is ds_read_b128, as in the forward.
#: The copies cost one pass over W (dx) and over dy, act'(z) and x (dW), against the product's 2 M N K FLOPs.
PRETRANSPOSE_FAMILIES: tuple[str, ...] = ("amd-cdna",)


#: Pointer-kernel products that run a persistent grid, per family. MI300X has 304 CUs in 8 XCDs; a grid of
#: (resident programs per CU) x CUs, a multiple of 8, keeps every program on one XCD for its whole life, and the
#: XCD remap (kernels/_program_order.py) applied to the tile index hands each XCD a contiguous run of tiles,
#: so A and B panels are reused in that XCD's L2. Resident programs per CU follow the entry's waves_per_eu
#: (4 SIMDs x waves_per_eu waves / num_warps waves per program; 1 when unset). Backward products only: in the
#: forward the tile loop lifts the silu epilogue from 111 to 130 VGPRs on gfx942 (bf16, compiled), past 128,
#: halving resident waves (4 -> 2 per SIMD); the backward kernels keep their occupancy (gfx942: 2-4 per SIMD).
PERSISTENT_PRODUCTS: dict[str, tuple[str, ...]] = {"amd-cdna": ("bwd",)}


def persistent_programs(tiles: int, cfg: TileConfig, arch: Arch, n_cus: int, product: str = "bwd") -> int:
    """Programs of the pointer kernels' persistent grid for `product` ("fwd" or "bwd"), or 0 for one program
    per tile (other families and products, or fewer tiles than the grid would hold)."""
    if product not in PERSISTENT_PRODUCTS.get(arch.family, ()):
        return 0
    per_cu = max(1, (arch.simds_per_cu * cfg.waves_per_eu) // min(cfg.num_warps, arch.max_num_warps))
    programs = n_cus * per_cu
    return programs if tiles > programs else 0


def _wide(dtype: torch.dtype) -> bool:
    return torch.empty((), dtype=dtype).element_size() > 2


def gemm_candidates(M: int, N: int, K: int, dtype: torch.dtype, arch: Arch, *, heavy: bool = False
                    ) -> list[TileConfig]:
    """Entries serving this M, most preferred first. heavy: the epilogue evaluates an activation and its
    derivative, or the kernel is a backward product (see GEMM_TABLES). fp32: BLOCK_K halved."""
    if min(M, N, K) < 1:
        raise ValueError(f"gemm: sizes must be >= 1, got M={M}, N={N}, K={K}")
    entries = [c for min_m, c in GEMM_TABLES["heavy" if heavy else "light"][arch.family] if min_m <= M]
    if _wide(dtype) and arch.family != "cpu":
        entries = [replace(c, BLOCK_K=max(16, c.BLOCK_K // 2), reason=c.reason + "; fp32: BLOCK_K halved")
                   for c in entries]
    return entries


def gemm_config(M: int, N: int, K: int, dtype: torch.dtype, arch: Arch, *, heavy: bool = False) -> TileConfig:
    """The default entry: a pure function of (M, N, K, dtype, architecture, epilogue weight)."""
    return gemm_candidates(M, N, K, dtype, arch, heavy=heavy)[0]


def num_xcds(arch: Arch) -> int:
    return XCDS.get(arch.name, 1)


# ---------------------------------------------------------------------------------------------------
# GEMM on TMA-capable NVIDIA GPUs (kernels/linear_tma.py): persistent, warp-specialized, operands by TMA.
# Used when every operand qualifies for a tensor descriptor (unit stride along the last dim, 16-byte
# aligned rows and base) and M reaches TMA_MIN_M; otherwise the pointer kernels above. Four kinds, a table
# each: "light" (no epilogue beyond bias/residual, plain backward products: transposed operands are a
# shared-memory view under TMA and cost no registers), "epilogue" (an activation and its derivative on the
# accumulator), "residual" (a residual tile staged beside the operands), "prologue" (the backward's
# dz = dy * act'(z), formed in registers from two loaded tiles). Each table's row is one entry per NVIDIA
# generation (TMA_FAMILIES): sm_90's is the default, sm_100's differs where its compile measured otherwise.

#: Compute capability from which NVIDIA GPUs take the TMA kernels: Hopper introduced the tensor memory
#: accelerator (cp.async.bulk.tensor) and Triton's warp specialization targets sm_90 and sm_100.
TMA_MIN_CC = 90

TmaKind = Literal["light", "residual", "epilogue", "prologue"]

#: The TMA tables' rows: per NVIDIA generation (sm_90 and sm_100 take different tiles) and the interpreter.
TMA_FAMILIES: tuple[str, ...] = ("hopper", "blackwell", "cpu")

#: The interpreter runs the TMA kernels with small tiles, so small test matrices cross several tiles in every
#: dimension and the persistent loop visits several tiles per program.
_CPU_TMA = Differs(_INTERPRETER, row=_T(32, 32, 4, 1, _INTERPRETER, BLOCK_K=16, GROUP_M=2, warp_specialize=True))


def tma_table(default: TileConfig, blackwell: Differs, cpu: Differs = _CPU_TMA) -> FamilyTable[TileConfig]:
    """One kind's (or product's) TMA entries over TMA_FAMILIES: sm_90's the default (its reason the table's),
    sm_100's where its compile measured otherwise, and the interpreter's."""
    return FamilyTable(default, default.reason, {"blackwell": blackwell, "cpu": cpu}, families=TMA_FAMILIES)


_HOPPER_LIGHT = _T(128, 256, 4, 3, "128x256x64, 3 stages: the Hopper warp specializer makes one producer and two "
                                   "consumer warpgroups (384 threads, from num_warps 4), each consumer a 64x256 "
                                   "wgmma accumulator (the largest wgmma N); sm_90 168 regs, 0 spill, 209 KiB",
                   BLOCK_K=64, GROUP_M=8, warp_specialize=True)

TMA_TABLES: dict[str, FamilyTable[TileConfig]] = {
    "light": tma_table(_HOPPER_LIGHT, Differs("128x256x64, 3 stages, tcgen05 with the accumulator in tensor memory; "
                                               "8 warps so the epilogue's tensor-memory load is spread over 256 "
                                               "threads", num_warps=8)),
    "residual": tma_table(
        replace(_HOPPER_LIGHT, reason="128x256x64, 3 stages as light: the residual tile fits beside it on sm_90 "
                                      "(209 KiB, 0 spill)"),
        Differs("128x128x64, 4 stages, 8 warps: the residual tile staged in shared memory takes 128x256x64 to "
                "272 KiB on sm_100 (over 227 KiB); this is 192 KiB, 0 spill", BLOCK_N=128, num_warps=8, num_stages=4)),
    "epilogue": tma_table(
        _T(128, 128, 4, 4, "128x128x64, 4 stages: the activation and its derivative need registers beside the "
                           "accumulator: 128x256 spills 944 B with gelu on sm_90; this is 0 spill, 161 KiB",
           BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        Differs("128x128x64, 4 stages, 8 warps: the activation epilogue on sm_100; 4 warps spill 1.5 KB loading the "
                "accumulator from tensor memory", num_warps=8)),
    "prologue": tma_table(
        _T(128, 128, 4, 4, "128x128x32, 4 stages: the dz = dy * act'(z) prologue stages A, act'(z) and their "
                           "transposes in shared memory: dW at 128x128x64 needs 273 KiB with 3 stages (over sm_90's "
                           "227 KiB); this is 193 KiB, 0 spill", BLOCK_K=32, GROUP_M=8, warp_specialize=True),
        Differs("128x128x32, 4 stages, 8 warps: the dz prologue on sm_100", num_warps=8)),
}

#: M from which the TMA kernels run. Below 64 rows a 128-row TMA tile is mostly padding, and the pointer
#: kernels' decode-sized entries (16-row tiles, GEMM_TABLES) serve: a threshold from tile geometry, not a timing.
TMA_MIN_M: FamilyTable[int] = FamilyTable(
    64, "below 64 rows a 128-row tile is more than half padding; the pointer kernels' 16-row entries serve",
    {"cpu": Differs("the interpreter runs the TMA kernels at every M, so small tests exercise them", row=1)},
    families=TMA_FAMILIES)


#: Split-K (TMA kernels): used when the output's tiles fill less than half the SMs and each K slice keeps at
#: least SPLIT_K_MIN_K_TILES k-steps (so the pipeline reaches steady state and the fp32 partials, 4 bytes per
#: output element per slice written and read once, stay small against the slice's operand traffic).
SPLIT_K_MIN_K_TILES = 8
SPLIT_K_MAX = 16
#: The split-K reduction + epilogue kernel: elementwise over [M, N], 64x64 tiles, 4 warps.
SPLITK_EPILOGUE = _T(64, 64, 4, 1, "split-K reduction and epilogue: elementwise, 16 fp32 per thread per slice")


def split_k(M: int, N: int, K: int, cfg: TileConfig, n_sms: int) -> int:
    """How many K slices the TMA kernels split a product into (1: none)."""
    tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
    k_tiles = -(-K // cfg.BLOCK_K)
    if 2 * tiles > n_sms:
        return 1
    return max(1, min(n_sms // tiles, k_tiles // SPLIT_K_MIN_K_TILES, SPLIT_K_MAX))


def tma_capable(arch: Arch) -> bool:
    """Whether `arch` runs the TMA kernels (the interpreter does: tests exercise them on CPU)."""
    if arch.family == "cpu":
        return True
    return arch.family == "nvidia" and _nvidia_cc(arch) >= TMA_MIN_CC


def _nvidia_cc(arch: Arch) -> int:
    return int(arch.name.removeprefix("sm_").rstrip("af"))


def tma_config(M: int, N: int, K: int, dtype: torch.dtype, arch: Arch, kind: TmaKind = "light") -> TileConfig | None:
    """The TMA kernels' entry for this problem, or None when the pointer kernels serve it (an architecture
    without TMA, or M below TMA_MIN_M). kind: "epilogue" with an activation in the forward epilogue, "residual"
    with a residual (and no activation), "prologue" for the backward products with the dz prologue, else
    "light". fp32: BLOCK_K halved."""
    if min(M, N, K) < 1:
        raise ValueError(f"gemm: sizes must be >= 1, got M={M}, N={N}, K={K}")
    if not tma_capable(arch):
        return None
    generation = "cpu" if arch.family == "cpu" else "hopper" if _nvidia_cc(arch) < 100 else "blackwell"
    if TMA_MIN_M[generation] > M:
        return None
    cfg = TMA_TABLES[kind][generation]
    if _wide(dtype) and arch.family != "cpu":
        cfg = replace(cfg, BLOCK_K=max(16, cfg.BLOCK_K // 2), reason=cfg.reason + "; fp32: BLOCK_K halved")
    return cfg


# ---------------------------------------------------------------------------------------------------
# Who computes each GEMM product of linear: our kernel or the vendor BLAS (torch.mm / torch.addmm: cuBLAS or
# cuBLASLt on NVIDIA, hipBLASLt / rocBLAS on ROCm). Vendor BLAS is a provider, not a rival: where our kernel
# fuses nothing it can only match the vendor's GEMM, so the vendor runs it; where our kernel fuses work the
# vendor would do in another pass over HBM, ours runs.

Provider = Literal["auto", "wavefront", "vendor"]
PROVIDERS: tuple[str, ...] = ("auto", "wavefront", "vendor")
GemmProduct = Literal["fwd", "dx", "dw"]


class ProviderChoice(NamedTuple):
    provider: Literal["wavefront", "vendor"]
    reason: str


_FUSES = {
    "fwd_activation": "the epilogue applies the activation (and writes act'(z) for backward) on the fp32 "
                      "accumulator: the vendor GEMM would write z and a second kernel read it back",
    "fwd_residual": "the epilogue adds the residual tile: torch.addmm with a [M, N] input first copies it into "
                    "the output (a read and a write of [M, N]) before the GEMM reads and writes it again",
    "fwd_plain": "nothing to fuse: plain F.linear, or a bias, which cuBLASLt / hipBLASLt add in their own "
                 "epilogue (torch.addmm with a 1-D bias)",
    "bwd_prologue": "dz = dy * act'(z) is formed in the GEMM prologue: the vendor needs dz written and read "
                    "back ([M, N] three times through HBM)",
    "dw_bias": "dbias is summed from the dz tiles the dW product already streams: the vendor needs another "
               "read of dy",
    "bwd_plain": "nothing to fuse: a plain product (no activation; the residual's gradient is dy itself)",
    "cpu": "interpreter: the CPU runs our kernels so that tests exercise them (there is no GPU BLAS to defer to)",
}


def gemm_provider(product: GemmProduct, arch: Arch, *, activation: bool, bias: bool = False,
                  residual: bool = False) -> ProviderChoice:
    """The rule for one product of linear ("fwd", "dx" or "dw") under provider="auto"."""
    if product not in ("fwd", "dx", "dw"):
        raise ValueError(f"gemm product must be 'fwd', 'dx' or 'dw', got {product!r}")
    if arch.family == "cpu":
        return ProviderChoice("wavefront", _FUSES["cpu"])
    if product == "fwd":
        if activation:
            return ProviderChoice("wavefront", _FUSES["fwd_activation"])
        if residual:
            return ProviderChoice("wavefront", _FUSES["fwd_residual"])
        return ProviderChoice("vendor", _FUSES["fwd_plain"])
    if activation:
        return ProviderChoice("wavefront", _FUSES["bwd_prologue"])
    if product == "dw" and bias:
        return ProviderChoice("wavefront", _FUSES["dw_bias"])
    return ProviderChoice("vendor", _FUSES["bwd_plain"])
