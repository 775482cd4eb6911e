"""The Gluon sm_90 attention forward: it cannot run here (no GPU, and the interpreter does not run Gluon), so
these tests check what a CPU can: the ahead-of-time compile for sm_90 and its machine code, the inspect rows
it adds, and that asking for it anywhere but sm_90 is refused."""

from __future__ import annotations

import pytest
import torch

from wavefront import runtime
from wavefront.kernels import attention_gluon
from wavefront.kernels._launch import recording
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case

GLUON_KERNEL = "_attn_fwd_sm90_gluon"


def _case(head_dim: int, causal: bool) -> Case:
    return Case(f"gluon_d{head_dim}", "dense GQA, two query tiles", {"batch": 1, "heads": 4, "kv_heads": 2,
                                                                      "seq": 256, "head_dim": head_dim},
                {"causal": causal})


def _gluon_job(head_dim: int, causal: bool):
    from wavefront.workbench.static.inspect import plan

    planned = plan([REGISTRY["attention"]], ["sm_90"], torch.bfloat16, keep_asm=True,
                   cases=lambda spec: [_case(head_dim, causal)])
    return [p for p in planned if p.kernel == GLUON_KERNEL]


def test_inspect_plans_the_variant_on_sm90_only():
    from wavefront.workbench.static.inspect import plan

    planned = plan([REGISTRY["attention"]], ["sm_90", "sm_100"], torch.bfloat16,
                   cases=lambda spec: [_case(128, True), _case(64, False)])
    gluon = [p for p in planned if p.kernel == GLUON_KERNEL]
    assert {p.target for p in gluon} == {"sm_90"}
    assert {p.mode for p in gluon} == {"fwd"}
    assert len(gluon) == 2  # one per case
    # The default kernels' rows are still there, under their own names.
    assert any(p.kernel == "_attn_fwd_tma_kernel" and p.target == "sm_90" for p in planned)


def test_variant_skips_head_dims_it_does_not_cover():
    from wavefront.workbench.static.variants import VARIANTS

    (variant,) = [v for v in VARIANTS if v.name == "gluon_sm90"]
    assert variant.covers(_case(128, False)) and variant.covers(_case(64, True))
    assert not variant.covers(_case(256, True))


@pytest.mark.parametrize("head_dim", [pytest.param(128, marks=pytest.mark.slow), 64])
def test_compiles_for_sm90_with_tma_and_overlap(head_dim):
    from wavefront.workbench.static.inspect import compile_jobs

    (p,) = _gluon_job(head_dim, causal=True)
    res = compile_jobs([p.job])[p.key]
    assert res.ok, res.error
    code = res.code
    assert code.spill_bytes == 0 and code.spill_count == 0
    assert code.regs <= 255
    assert code.tma_ops >= 4  # Q, K and V loads and the O store go by TMA (UTMALDG / UTMASTG)
    assert code.matrix_families == ["wgmma"]
    assert code.min_mma_n == min(128, head_dim)
    # The PTX leaves S_{j+1} in flight while P_j V_j is issued, and ptxas kept it asynchronous: a
    # WARPGROUP.DEPBAR with a depth of 1 exists in the SASS (ptxas's serialization would leave only 0s).
    assert "wgmma.wait_group.sync.aligned 1;" in res.asm["ptx"]
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in res.asm["sass"]
    assert res.shared_bytes <= 227 * 1024
    # Ring safety: between each wgmma wait and the next TMA load (the refill of a stage the two warpgroups
    # just read: the prologue's after S_0, the loop's two) there is a block-wide bar.sync. The pipeline model
    # (workbench/static/pipeline_models.py) assumes exactly these barriers.
    ptx = res.asm["ptx"]
    waits = [i for i in range(len(ptx)) if ptx.startswith("wgmma.wait_group.sync.aligned", i)]
    refills = 0
    for w in waits:
        after = ptx[w:]
        load = after.find("cp.async.bulk.tensor.2d.shared::cta.global")
        next_wait = after.find("wgmma.wait_group", 1)
        if load < 0 or 0 <= next_wait < load:
            continue
        refills += 1
        assert "bar.sync" in after[:load], ptx[w:w + 40]
    assert refills == 3
    # The model's copies, in program order, are the machine code's: before the key loop Q, the ring's first
    # fill and the refill after S_0; inside it one K and one V refill.
    from wavefront.workbench.static.parse import sass_tma_loads_by_loop

    assert sass_tma_loads_by_loop(res.asm["sass"]) == (*_model_copies(attention_gluon.NUM_STAGES[head_dim]), 0)


def _model_copies(num_stages: int) -> tuple[int, int]:
    """TMA copies the pipeline model issues before the key loop and in one iteration of it (a long sequence)."""
    from wavefront.workbench.static.pipeline_check import Pipeline
    from wavefront.workbench.static.pipeline_models import gluon_attention_fwd

    where: list[str] = []

    class Counting(Pipeline):
        def issue(self, ring, stage, block, pred=True, *, at):
            if pred:
                where.append(at)
            super().issue(ring, stage, block, pred, at=at)

    p = Counting(2)
    gluon_attention_fwd(p, seqlen=16 * attention_gluon.BLOCK, m_block=0, causal=False, num_stages=num_stages)
    assert not p.violations
    return where.count("prologue"), where.count("loop j=0")


# Refusals off sm_90 and the input errors: tests/kernels/test_attention_fa3.py, for both Hopper Gluon kernels.


def test_launch_matches_the_forward_contract():
    """Recorded (not run) on sm_90: o like q, lse2 [B, H, S] fp32, one program per (batch, head, query tile)."""
    q = torch.zeros(2, 4, 300, 128, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 300, 128, dtype=torch.bfloat16)
    with runtime.assume_target("sm_90", 132), recording(execute=False) as launches:
        o, lse2 = attention_gluon.attention_fwd(q, k, k, True, 128 ** -0.5, arch=runtime.get_arch("sm_90"))
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse2.shape == (2, 4, 300) and lse2.dtype == torch.float32
    (la,) = launches
    assert la.grid == (3 * 2 * 4,)
    assert la.constexprs["BLOCK_M"] == la.constexprs["BLOCK_N"] == 128
    assert la.options["num_warps"] == 8


_SASS_STUB = "\n".join([
    # The key loop 0x10..0x60: one HGMMA, a depth-1 wait, one barrier. The epilogue (0x70..0x90) holds two
    # HGMMA and a wait 0. An mbarrier wait at 0x20 has its retry path after EXIT (0xb0..0xd0), which jumps
    # back to 0x30: a backward branch whose span holds more HGMMA than the loop.
    "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
    "        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;",
    "        /*0020*/              @!P0 BRA 0xb0 ;",
    "        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;",
    "        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;",
    "        /*0050*/                   MUFU.EX2 R2, R3 ;",
    "        /*0060*/              @P1 BRA 0x10 ;",
    "        /*0070*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;",
    "        /*0080*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;",
    "        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
    "        /*00a0*/                   EXIT ;",
    "        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x28000], R0 ;",
    "        /*00c0*/              @!P0 BRA 0xb0 ;",
    "        /*00d0*/                   BRA 0x30 ;",
    "        /*00e0*/                   BRA 0xe0 ;",
])


def test_retry_stub_after_exit_is_not_the_main_loop():
    """The jump back from a slow path placed after EXIT spans the loop's tail, the epilogue and EXIT: not a
    loop. The main loop is the real one (wait depth 1, one barrier), not that span."""
    from wavefront.workbench.static.parse import parse_sass

    code = parse_sass(_SASS_STUB)
    assert (code.mma_wait_depth, code.loop_barriers) == (1, 1)


def test_inspect_skips_inputs_the_variant_refuses():
    """fp32 (which ops.attention accepts for testing) is refused by the Gluon launcher: no row, no error."""
    from wavefront.workbench.static.variants import VARIANTS, capture_variant

    (variant,) = [v for v in VARIANTS if v.name == "gluon_sm90"]
    with runtime.assume_target("sm_90", 132):
        assert capture_variant(REGISTRY["attention"], _case(64, False), torch.float32, variant) == []
        (la,) = capture_variant(REGISTRY["attention"], _case(64, False), torch.bfloat16, variant)
    assert la.name == GLUON_KERNEL
