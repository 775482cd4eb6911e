"""The Gluon sm_100 dK/dV backward (kernels/attention_bwd_gluon.py). It cannot run here (no GPU; Gluon has no
interpreter, so its numerics are unchecked until a GPU runs it), so these tests check what a CPU can: its
schedule helpers against brute force, its protocol on the executable model (and that the model catches broken
variants), the ahead-of-time compile for sm_100 and the barriers per iteration read from its machine code, and
that asking for it off sm_100 or with inputs it does not take is a clear error."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import wavefront
from wavefront import runtime
from wavefront.kernels import attention as kernels
from wavefront.kernels import attention_bwd_gluon as bwdg
from wavefront.kernels._launch import recording
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case
from wavefront.workbench.static.parse import _sass_listing, _sass_main_loop
from wavefront.workbench.static.pipeline_check import POLICIES, run_ws_model
from wavefront.workbench.static.pipeline_models import (
    BWD_SCHEDULE,
    MODELS,
    WsKernelModel,
    bwd_dkdv_grid,
    bwd_dkdv_quick_grid,
    gluon_attention_bwd_dkdv,
)

KERNEL = "_attn_bwd_dkdv_sm100_gluon"
SM100 = runtime.get_arch("sm_100")


# -- the schedule helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group_size", [1, 3])
def test_tiles_are_every_query_tile_of_every_head_from_the_diagonal(causal, group_size):
    """The loop's (query head, first row) sequence is, head by head, every query tile a key tile meets: from
    the key tile's first row when causal (a tile boundary: BLOCK_N is a multiple of BLOCK_M), else from 0."""
    sch, bm, bn = BWD_SCHEDULE, bwdg.BLOCK_M, bwdg.BLOCK_N
    for seqlen in (1, 63, 64, 65, 128, 129, 300, 513):
        for n_block in range(-(-seqlen // bn)):
            start_n = n_block * bn
            lo = sch.first_row(start_n, causal)
            n_tiles = sch.n_tiles(seqlen, lo, bm)
            got = [(sch.tile_head(j, n_tiles), sch.tile_row(j, n_tiles, lo, bm)) for j in range(group_size * n_tiles)]
            first = start_n if causal else 0
            want = [(g, row) for g in range(group_size) for row in range(first, seqlen, bm)]
            assert got == want, (seqlen, n_block)


def test_phases_follow_the_stage_uses():
    sch = BWD_SCHEDULE
    for ns in (1, 2, 3):
        for j in range(12):
            uses = sum(1 for i in range(j) if sch.stage(i, ns) == sch.stage(j, ns))  # earlier copies into the stage
            assert sch.ready_phase(j, ns) == uses & 1
            assert sch.empty_phase(j, ns) == sch.ready_phase(j, ns) ^ 1
    assert [sch.mma_phase(j) for j in range(4)] == [0, 1, 0, 1]


# -- the protocol, on the model --------------------------------------------------------------------------


def test_model_is_registered_and_the_quick_grid_passes():
    (km,) = [m for m in MODELS if m.kernel == KERNEL]
    assert km.model is gluon_attention_bwd_dkdv
    report = WsKernelModel(KERNEL, km.model, bwd_dkdv_quick_grid).check()
    assert report.runs >= 300 and report.ok, report.as_dict()["failures"][:2]


@pytest.mark.slow  # about 5 s; the static gate runs it on every run
def test_model_full_grid_passes():
    (km,) = [m for m in MODELS if m.kernel == KERNEL]
    report = km.check()
    assert report.runs >= 3000 and report.ok, report.as_dict()["failures"][:2]


def test_the_grid_covers_tile_edges_gqa_and_every_depth():
    grid = list(bwd_dkdv_grid())
    assert {g["num_stages"] for g in grid} == {1, 2, 3, 4}
    assert {g["head_dim"] for g in grid} == set(bwdg.NUM_STAGES)
    assert {g["group_size"] for g in grid} == {1, 2, 4} and {g["causal"] for g in grid} == {False, True}
    lengths = {g["seqlen"] for g in grid}
    assert {63, 64, 65, 127, 128, 129, 255, 256, 257} <= lengths


_CFG = {"seqlen": 257, "n_block": 0, "causal": True, "group_size": 2, "num_stages": 2}


def _kinds(run) -> set[str]:
    return {v.kind for v in run.violations}


def test_releasing_a_stage_before_dk_is_issued_is_caught():
    """The stage's empty barrier signalled by dV's completion: the loader refills Q's buffer before dK, which
    reads it, is issued (with the loader running ahead)."""
    run = run_ws_model(gluon_attention_bwd_dkdv, "producer-first", **_CFG, release_before_dk=True)
    assert _kinds(run) & {"read-wrong-block", "read-not-ready"}
    assert run_ws_model(gluon_attention_bwd_dkdv, "producer-first", **_CFG).ok


def test_loader_waiting_the_consumers_phase_deadlocks():
    """The empty barrier's parity must be the complement of the ready one (a fresh barrier passes parity 1)."""
    broken = dataclasses.replace(BWD_SCHEDULE, empty_phase=BWD_SCHEDULE.ready_phase)
    for policy in POLICIES:
        run = run_ws_model(gluon_attention_bwd_dkdv, policy, **_CFG, schedule=broken)
        assert run.deadlocked and "deadlock" in _kinds(run)


def test_an_mma_phase_off_by_one_deadlocks():
    broken = dataclasses.replace(BWD_SCHEDULE, mma_phase=lambda j: (j + 1) & 1)
    assert run_ws_model(gluon_attention_bwd_dkdv, "random-1", **_CFG, schedule=broken).deadlocked


def test_a_ring_with_one_stage_in_use_is_caught():
    broken = dataclasses.replace(BWD_SCHEDULE, stage=lambda j, ns: 0)
    for policy in POLICIES:
        assert not run_ws_model(gluon_attention_bwd_dkdv, policy, **_CFG, schedule=broken).ok


def test_a_tile_past_the_sequence_is_caught():
    """One query tile too many per head (rounding up once more): a copy wholly past the rows."""
    broken = dataclasses.replace(BWD_SCHEDULE, n_tiles=lambda seqlen, lo, bm: (seqlen - lo) // bm + 1)
    run = run_ws_model(gluon_attention_bwd_dkdv, "producer-first", **dict(_CFG, seqlen=256))
    assert run.ok
    run = run_ws_model(gluon_attention_bwd_dkdv, "producer-first", **dict(_CFG, seqlen=256), schedule=broken)
    assert "copy-past-end" in _kinds(run)


# -- the machine code ------------------------------------------------------------------------------------


def _case(head_dim: int, causal: bool) -> Case:
    return Case(f"gluon_bwd_d{head_dim}", "dense GQA, three key tiles",
                {"batch": 1, "heads": 4, "kv_heads": 2, "seq": 384, "head_dim": head_dim}, {"causal": causal})


def _planned(targets, cases):
    from wavefront.workbench.static.inspect import plan

    return plan([REGISTRY["attention"]], targets, torch.bfloat16, keep_asm=True, cases=lambda spec: cases)


def test_inspect_plans_the_variant_on_sm100_bwd_only():
    planned = _planned(["sm_90", "sm_100"], [_case(128, True), _case(64, False), _case(256, True)])
    ours = [p for p in planned if p.kernel == KERNEL]
    assert {(p.target, p.mode) for p in ours} == {("sm_100", "bwd")}
    assert len(ours) == 2  # d128 and d64; d256 is not covered
    # The default's rows: its TMA kernel at d128 and d64, its pointer kernel at d256 (d_split).
    assert {p.case.name for p in planned if p.kernel == "_attn_bwd_dkdv_tma_kernel" and p.target == "sm_100"} == {
        p.case.name for p in ours}
    assert any(p.kernel == "_attn_bwd_dkdv_kernel" and p.target == "sm_100" for p in planned)


@pytest.mark.parametrize("head_dim,causal", [(128, True), pytest.param(64, False, marks=pytest.mark.slow)])
def test_compiles_for_sm100_with_at_most_four_barriers_per_iteration(head_dim, causal):
    """About 10 s per compile. The issue's bar: at most 4 block-wide barriers per main-loop iteration on sm_100
    (Triton's dK/dV loop has 8, tests/ops/test_attention_bwd_tma.py)."""
    from wavefront.workbench.static.inspect import compile_jobs

    (p,) = [p for p in _planned(["sm_100"], [_case(head_dim, causal)]) if p.kernel == KERNEL]
    res = compile_jobs([p.job])[p.key]
    assert res.ok, res.error
    code, ptx, sass = res.code, res.asm["ptx"], res.asm["sass"]
    assert code.spill_bytes == 0 and code.spill_count == 0
    assert res.shared_bytes <= SM100.shared_mem_per_block
    assert code.matrix_families == ["tcgen05"] and code.min_mma_n == bwdg.BLOCK_M
    assert code.loop_barriers is not None and code.loop_barriers <= 4
    # Every barrier in the loop is barrier 0 over the compute partition's 128 threads, not the whole block's
    # 256 (the loader warp synchronizes by mbarriers only).
    ops, operands, address = _sass_listing(sass)
    loop = _sass_main_loop(ops, operands, address)
    bars = [operands[i].strip() for i in range(loop.first, loop.last + 1) if ops[i].startswith("BAR.")]
    assert len(bars) == code.loop_barriers and set(bars) == {"0x0, 0x80 ;"}
    assert ".reqntid 256" in ptx
    # The loader warp issues the copies (3-D for Q and dO) and gives its registers back.
    assert code.tma_ops >= 4 and "cp.async.bulk.tensor.3d" in ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 \t{int(bwdg.LOADER_REGS)};" in ptx


# -- host side -------------------------------------------------------------------------------------------


def _bwd(arch_name: str, head_dim: int = 64, dtype=torch.bfloat16, cu=None, deterministic=True, q=None):
    q = torch.zeros(1, 4, 256, head_dim, dtype=dtype) if q is None else q
    kv = torch.zeros(1, 2, 256, head_dim, dtype=dtype)
    with recording(execute=False) as launches:
        grads = kernels.attention_bwd(q, q, kv, kv, q, torch.zeros(1, 4, 256), True, 0.1, cu, 256 if cu is not None
                                      else 0, arch=runtime.get_arch(arch_name), deterministic=deterministic)
    return grads, launches


def test_refused_off_sm100_and_off_by_default(monkeypatch):
    monkeypatch.delenv(bwdg.ENV_FLAG, raising=False)
    assert not bwdg.requested()
    _, launches = _bwd("sm_100")
    assert KERNEL not in {la.name for la in launches}
    monkeypatch.setenv(bwdg.ENV_FLAG, "1")
    assert bwdg.requested()
    for name in ("sm_80", "sm_90", "gfx942", "cpu"):
        with pytest.raises(RuntimeError, match=f"{bwdg.ENV_FLAG}.*sm_100.*{name}"):
            _bwd(name)
    q = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    out = wavefront.ops.attention(q, q, q, causal=True)  # the forward is the default one
    with pytest.raises(RuntimeError, match=bwdg.ENV_FLAG):  # the public op's backward routes through the flag
        out.sum().backward()


def test_inputs_it_does_not_cover_are_clear_errors(monkeypatch):
    monkeypatch.setenv(bwdg.ENV_FLAG, "1")
    with pytest.raises(ValueError, match="head_dim 64 or 128, got 96"):
        _bwd("sm_100", head_dim=96)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        _bwd("sm_100", dtype=torch.float32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        _bwd("sm_100", cu=torch.tensor([0, 256], dtype=torch.int32))
    with pytest.raises(ValueError, match="'deterministic' must be True"):
        _bwd("sm_100", deterministic=False)
    odd = torch.zeros(1, 4, 256, 65, dtype=torch.bfloat16)[..., :64]
    with pytest.raises(ValueError, match="'q' addressable by TMA"):
        _bwd("sm_100", q=odd)


def test_a_do_tma_cannot_read_is_copied(monkeypatch):
    """dO comes from autograd in any layout: a broadcast one (stride 0) reaches the kernel as a dense copy."""
    monkeypatch.setenv(bwdg.ENV_FLAG, "1")
    q = torch.zeros(1, 4, 256, 64, dtype=torch.bfloat16)
    kv = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    do = torch.ones(64, dtype=torch.bfloat16).expand(1, 4, 256, 64)
    with recording(execute=False) as launches:
        kernels.attention_bwd(do, q, kv, kv, q, torch.zeros(1, 4, 256), True, 0.1, arch=SM100)
    la = [la for la in launches if la.name == KERNEL][0]
    names = [n for n in la.kernel.arg_names if n not in la.constexprs]
    assert [la.args[names.index(f"stride_do{d}")] for d in "bhs"] == [4 * 256 * 64, 256 * 64, 64]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_flag_routes_dkdv_to_the_gluon_kernel_and_keeps_the_triton_dq(monkeypatch, head_dim):
    """Recorded (not run) on sm_100: the delta pre-pass, this kernel instead of the Triton dK/dV kernel (one
    program per (batch, K/V head, key tile)), then the Triton dQ pass; gradients shaped like their inputs."""
    monkeypatch.setenv(bwdg.ENV_FLAG, "1")
    (dq, dk, dv), launches = _bwd("sm_100", head_dim=head_dim)
    assert [la.name for la in launches] == ["_attn_bwd_delta_kernel", KERNEL, "_attn_bwd_dq_kernel"]
    assert dq.shape == (1, 4, 256, head_dim) and dk.shape == dv.shape == (1, 2, 256, head_dim)
    la = launches[1]
    assert la.grid == (2 * 2,)  # 256 keys / BLOCK_N 128, two K/V heads
    assert la.constexprs["NUM_STAGES"] == bwdg.NUM_STAGES[head_dim] and la.constexprs["HEAD_DIM"] == head_dim
    assert la.options["num_warps"] == bwdg.NUM_WARPS
    names = [n for n in la.kernel.arg_names if n not in la.constexprs]
    assert la.args[names.index("group_size")] == 2
