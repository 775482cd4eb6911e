"""The FA3-schedule sm_90 attention forward (kernels/attention_fa3.py). It cannot run here (no GPU; Gluon has no
interpreter), so these tests check what a CPU can: its schedule helpers against brute force, its protocol on the
executable model (and that the model catches broken variants), the ahead-of-time compile for sm_90 and the
design read from its machine code, and that asking for it off sm_90 or with inputs it does not take is a clear
error."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import wavefront
from wavefront import runtime
from wavefront.kernels import attention_fa3 as fa3
from wavefront.kernels import attention_gluon
from wavefront.kernels._launch import recording
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case
from wavefront.workbench.static.parse import parse_sass, ptx_consumer_warpgroups
from wavefront.workbench.static.pipeline_check import POLICIES, WarpSpecialized, run_ws_model
from wavefront.workbench.static.pipeline_models import (
    FA3_SCHEDULE,
    MODELS,
    WsKernelModel,
    fa3_attention_fwd,
    fa3_quick_grid,
)

KERNEL = "_attn_fwd_sm90_fa3"
key_blocks = FA3_SCHEDULE.key_blocks
tile_coords = FA3_SCHEDULE.tile_coords


# -- the schedule helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize("block_m,block_n", [(128, 128), (128, 64), (64, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_key_blocks_split_masked_from_unmasked(block_m, block_n, causal):
    """Brute force over every (query row, key): the unmasked blocks hold only valid pairs, every valid key of
    the tile lies in [0, n_blocks), and each masked block holds at least one invalid pair."""
    for seqlen in (1, 63, 64, 65, 127, 128, 129, 200, 256, 300):
        for m_block in range(-(-seqlen // block_m)):
            n_unmasked, n_blocks = key_blocks(m_block, seqlen, block_m, block_n, causal)
            rows = range(m_block * block_m, (m_block + 1) * block_m)  # rows past seqlen are computed, not stored

            def valid(r: int, k: int, seqlen: int = seqlen) -> bool:
                return k < seqlen and (not causal or k <= r)

            for k in range(n_unmasked * block_n):
                assert all(valid(r, k) for r in rows), (seqlen, m_block, k)
            for r in rows:
                if r < seqlen:
                    assert all(k < n_blocks * block_n for k in range(seqlen) if valid(r, k))
            for blk in range(n_unmasked, n_blocks):
                keys = range(blk * block_n, (blk + 1) * block_n)
                assert any(not valid(r, k) for r in rows for k in keys), (seqlen, m_block, blk)


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_order_covers_every_tile_once_longest_first(causal):
    n_bh, seqlen = 3, 700
    n_m = -(-seqlen // fa3.BLOCK_M)
    n_tiles = n_m * n_bh
    seen = [tile_coords(t, n_bh, n_m, causal) for t in range(n_tiles)]
    assert sorted(seen) == sorted((bh, m) for bh in range(n_bh) for m in range(n_m))
    work = [key_blocks(m, seqlen, fa3.BLOCK_M, fa3.BLOCK_N, causal)[1] for _, m in seen]
    assert work == sorted(work, reverse=True)  # each program takes tiles in this order: the longest first
    for n_sms in (1, 4, 132):
        progs = fa3.grid_size(n_tiles, n_sms)
        assert progs == min(n_tiles, n_sms)
        assert sorted(t for p in range(progs) for t in range(p, n_tiles, progs)) == list(range(n_tiles))


# -- the protocol, on the model --------------------------------------------------------------------------


def test_model_is_registered_and_the_quick_grid_passes():
    (km,) = [m for m in MODELS if m.kernel == KERNEL]
    report = WsKernelModel(KERNEL, km.model, fa3_quick_grid, POLICIES[:3]).check()
    assert report.runs >= 300 and report.ok, report.as_dict()["failures"][:2]


@pytest.mark.slow
def test_model_full_grid_passes():
    (km,) = [m for m in MODELS if m.kernel == KERNEL]
    report = km.check()
    assert report.runs >= 5000 and report.ok, report.as_dict()["failures"][:2]


_CFG = {"seqlen": 385, "n_bh": 2, "causal": True, "num_stages": 2, "n_programs": 1, "pid": 0}


def _kinds(run) -> set[str]:
    return {v.kind for v in run.violations}


@pytest.mark.parametrize("policy", POLICIES)
def test_missing_opening_arrive_deadlocks(policy):
    """Without consumer 1's first bar.arrive, consumer 0 waits for its turn forever (and so does the ring)."""
    run = run_ws_model(fa3_attention_fwd, policy, **_CFG, pre_arrive=False)
    assert run.deadlocked and "deadlock" in _kinds(run)


def test_releasing_stages_before_their_waits_is_caught():
    """A consumer that marks K's and V's stages free before the waits that retire its wgmmas: flagged at the
    release, and with the producer running ahead the refill lands on a stage a wgmma may still read."""
    run = run_ws_model(fa3_attention_fwd, "producer-first", **_CFG, release_before_wait=True)
    assert {"release-while-read", "refill-while-read"} <= _kinds(run)


def test_producer_waiting_the_consumers_phase_deadlocks():
    """The empty barrier's parity must be the complement of the consumers' (a fresh barrier passes parity 1):
    waiting for the consumers' own parity blocks the first copy forever."""
    broken = dataclasses.replace(FA3_SCHEDULE, kv_free_phase=FA3_SCHEDULE.kv_phase)
    run = run_ws_model(fa3_attention_fwd, "random-1", **_CFG, schedule=broken)
    assert run.deadlocked


def test_a_ring_with_one_stage_in_use_overwrites_or_deadlocks():
    """Every block into stage 0 of a two-stage ring: the phases stop matching the copies."""
    broken = dataclasses.replace(FA3_SCHEDULE, kv_stage=lambda count, ns: 0)
    for policy in POLICIES:
        assert not run_ws_model(fa3_attention_fwd, policy, **_CFG, schedule=broken).ok


def test_pingpong_and_named_barrier_rules():
    ws = WarpSpecialized()
    state: dict = {}
    ws.run("consumer0", ("burst", "a"), state)
    ws.run("consumer0", ("burst", "b"), state)
    ws.run("consumer1", ("bar_arrive", 14, "c"), state)
    ws.run("consumer1", ("bar_arrive", 14, "d"), state)  # again before consumer 0 synced: undefined in hardware
    ws.finish()
    assert [v.kind for v in ws.violations] == ["pingpong-order", "barrier-overrun", "barrier-unbalanced"]


# -- machine code ------------------------------------------------------------------------------------------


def _case(head_dim: int, causal: bool) -> Case:
    return Case(f"fa3_d{head_dim}", "dense GQA, two query tiles", {"batch": 1, "heads": 4, "kv_heads": 2,
                                                                    "seq": 256, "head_dim": head_dim},
                {"causal": causal})


def _compile(head_dim: int, causal: bool):
    from wavefront.workbench.static.inspect import compile_jobs, plan

    planned = plan([REGISTRY["attention"]], ["sm_90"], torch.bfloat16, keep_asm=True,
                   cases=lambda spec: [_case(head_dim, causal)])
    (p,) = [p for p in planned if p.kernel == KERNEL]
    res = compile_jobs([p.job])[p.key]
    assert res.ok, res.error
    return res


@pytest.mark.slow  # 20-40 s per compile on a shared CPU; the static gate compiles it on every run
@pytest.mark.parametrize("head_dim,causal", [(128, True), (64, False)])
def test_compiles_for_sm90_at_fa3s_design(head_dim, causal):
    res = _compile(head_dim, causal)
    code, ptx, sass = res.code, res.asm["ptx"], res.asm["sass"]
    assert code.spill_bytes == 0 and code.spill_count == 0
    assert res.shared_bytes <= 227 * 1024
    assert code.matrix_families == ["wgmma"] and code.tma_ops >= 4
    # Warp specialization: a producer that gives registers back and two consumer warpgroups that take them.
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{fa3.PRODUCER_REGS};" in ptx
    assert f"setmaxnreg.inc.sync.aligned.u32 \t{fa3.CONSUMER_REGS};" in ptx
    assert code.consumer_warpgroups == 2
    # Ping-pong on named barriers 14/15 in the main loop, which carries no mask, and the softmax issued under
    # P_j V_j (a depth-1 wait in the loop).
    assert code.pingpong is True
    assert code.loop_mask_ops == 0
    assert code.mma_overlap_depth is not None and code.mma_overlap_depth >= 1
    assert "BAR.SYNC.DEFER_BLOCKING 0xe, 0x100" in sass and "BAR.ARV 0xf, 0x100" in sass
    # Triton's own barriers (partition-local) use other ids: no collision with the ping-pong pair.
    triton_ids = {int(line.split()[1].rstrip(",")) for line in ptx.splitlines()
                  if line.strip().startswith("bar.sync") and "%r" not in line}
    assert triton_ids and not triton_ids & {fa3.PINGPONG_BAR, fa3.PINGPONG_BAR + 1}


# -- the readers of the new inspect fields, on stubs -------------------------------------------------------

_SASS = "\n".join([
    "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
    "        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0xe, 0x100 ;",
    "        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;",
    "        /*0030*/                   BAR.ARV 0xf, 0x100 ;",
    "        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;",
    "        /*0050*/                   ISETP.GE.AND P3, PT, R6, R11, PT ;",
    "        /*0060*/                   ISETP.GT.AND P2, PT, R5, R11, P3 ;",
    "        /*0070*/                   FSEL R154, R26, -INF , P2 ;",
    "        /*0080*/                   FSEL R155, R27, R28, P1 ;",
    "        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
    "        /*00a0*/              @P1 BRA 0x10 ;",
    "        /*00b0*/                   EXIT ;",
])


def test_sass_readers_of_pingpong_masks_and_overlap():
    code = parse_sass(_SASS)
    assert code.pingpong is True
    assert code.loop_mask_ops == 3  # the -INF select and the two compares its predicate comes from
    assert (code.mma_wait_depth, code.mma_overlap_depth) == (0, 1)
    plain = parse_sass(_SASS.replace("BAR.ARV 0xf", "BAR.SYNC.DEFER_BLOCKING 0x0").replace("-INF", "R9"))
    assert plain.pingpong is False and plain.loop_mask_ops == 0


def test_ptx_consumer_warpgroups():
    ws = ".reqntid 384\n setmaxnreg.dec.sync.aligned.u32 \t24;\n setmaxnreg.inc.sync.aligned.u32 \t240;"
    assert ptx_consumer_warpgroups(ws) == 2
    assert ptx_consumer_warpgroups(ws.replace("\t24;", "\t120;")) == 3  # no partition drops to a producer's
    assert ptx_consumer_warpgroups("setmaxnreg.dec.sync.aligned.u32 \t24;") is None


# -- host side -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mod", [fa3, attention_gluon], ids=["fa3", "gluon"])
def test_refused_off_sm90_and_routed_by_its_flag(monkeypatch, mod):
    monkeypatch.setenv(mod.ENV_FLAG, "1")
    assert mod.requested()
    for name in ("sm_80", "sm_100", "gfx942", "cpu"):
        with pytest.raises(RuntimeError, match=f"{mod.ENV_FLAG}.*sm_90.*{name}"):
            mod.attention_fwd(torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16), *[torch.zeros(1, 2, 16, 64,
                              dtype=torch.bfloat16)] * 2, True, 0.125, arch=runtime.get_arch(name))
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=mod.ENV_FLAG):  # the public op routes through the flag
        wavefront.ops.attention(q, q, q, causal=True)
    monkeypatch.setenv(mod.ENV_FLAG, "0")
    assert not mod.requested()


@pytest.mark.parametrize("mod", [fa3, attention_gluon], ids=["fa3", "gluon"])
def test_inputs_it_does_not_cover_are_clear_errors(mod):
    sm90 = runtime.get_arch("sm_90")
    q = torch.zeros(1, 2, 16, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim 64 or 128, got 96"):
        mod.attention_fwd(q, q, q, False, 0.1, arch=sm90)
    q = torch.zeros(1, 2, 16, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        mod.attention_fwd(q, q, q, False, 0.1, arch=sm90)
    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cu_seqlens"):
        mod.attention_fwd(q, q, q, False, 0.1, torch.tensor([0, 16]), arch=sm90)
    odd = torch.zeros(1, 2, 16, 65, dtype=torch.bfloat16)[..., :64]
    with pytest.raises(ValueError, match="'q' addressable by TMA"):
        mod.attention_fwd(odd, q, q, False, 0.1, arch=sm90)


@pytest.mark.parametrize("seq,expect_grid", [(300, 24), (8192, 132)])
def test_launch_is_persistent(seq, expect_grid):
    """Recorded (not run) on sm_90: o like q, lse2 [B, H, S] fp32, grid = min(tiles, SMs)."""
    q = torch.zeros(2, 4, seq, 128, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, seq, 128, dtype=torch.bfloat16)
    with runtime.assume_target("sm_90", 132), recording(execute=False) as launches:
        o, lse2 = fa3.attention_fwd(q, k, k, True, 128 ** -0.5, arch=runtime.get_arch("sm_90"))
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse2.shape == (2, 4, seq) and lse2.dtype == torch.float32
    (la,) = launches
    assert la.grid == (expect_grid,)
    names = [n for n in la.kernel.arg_names if n not in la.constexprs]
    assert la.args[names.index("n_tiles")] == -(-seq // 128) * 8  # every (batch, head, query tile), once
    assert la.constexprs["NUM_STAGES"] == fa3.NUM_STAGES[128] and la.options["num_warps"] == fa3.NUM_WARPS


def test_static_gate_keeps_the_design_fields():
    from wavefront.workbench.static import gate

    key = "attention/fwd/llama3-8b_s8192_causal/_attn_fwd_sm90_fa3@sm_90"
    base = {"ok": True, "pingpong": True, "loop_mask_ops": 0, "mma_overlap_depth": 1, "consumer_warpgroups": 2}
    assert gate.compare_inspect({key: base}, {key: dict(base)})[0] == []
    worse = dict(base, pingpong=False, loop_mask_ops=120, mma_overlap_depth=0)
    assert [f.rule for f in gate.compare_inspect({key: base}, {key: worse})[0]] == ["pingpong", "loop-mask",
                                                                                    "mma-overlap"]
    old = {"ok": True}  # a baseline written before the fields: not compared
    assert gate.compare_inspect({key: old}, {key: worse})[0] == []
