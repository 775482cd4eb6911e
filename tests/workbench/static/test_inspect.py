"""Inspection: specialization like the JIT, parsers on real compiled output, occupancy, the registry walk.

Compiles run in worker processes (the interpreter is on in this process). The default suite compiles for
sm_90 and gfx942; the slow suite covers all six targets and the whole registry.
"""

from __future__ import annotations

import _kernels
import pytest
import torch

from wavefront import runtime
from wavefront.ops import REGISTRY
from wavefront.workbench.static import parse as ip
from wavefront.workbench.static.aot import CompileJob, TensorProxy
from wavefront.workbench.static.capture import capture
from wavefront.workbench.static.inspect import compile_jobs, inspect_ops, job_for, specialization_key
from wavefront.workbench.static.occupancy import occupancy

FAST_TARGETS = ("sm_90", "gfx942")


def _job(fn, args, constexprs, target, num_warps=4, num_stages=1) -> CompileJob:
    py = fn.fn
    return CompileJob(py.__module__, py.__qualname__, py.__code__.co_filename, tuple(args),
                      tuple(sorted(constexprs.items())), (("num_stages", num_stages), ("num_warps", num_warps)),
                      target)


def _compile(*jobs: CompileJob):
    results = compile_jobs(jobs)
    return [results[specialization_key(j)] for j in jobs]


# ---------------------------------------------------------------------------------------------------
# Occupancy against hand-computed values.


def test_occupancy_sm90_by_hand():
    # 256 threads = 8 warps, 34 regs: 34 * 32 = 1088 -> 1280 per warp (256-register units); a sub-partition
    # (16384 regs) holds 12 warps, the SM 48 -> 6 blocks of 8 warps: 48 / 64 warps = 75%, register-limited.
    occ = occupancy("sm_90", threads_per_block=256, regs_per_thread=34, shared_bytes=32, static_shared_bytes=1024)
    assert (occ.active, occ.blocks_per_sm, occ.limiter) == (48, 6, "registers")
    assert occ.fraction == pytest.approx(0.75)
    # Shared memory: 100 KiB dynamic + the 1 KiB reservation -> 103424 B; 233472 // 103424 = 2 blocks.
    occ = occupancy("sm_90", threads_per_block=128, regs_per_thread=32, shared_bytes=100 * 1024)
    assert (occ.blocks_per_sm, occ.active, occ.limiter) == (2, 8, "shared")
    # 1024 threads at 128 registers need 131072 > 65536: the launch cannot fit.
    assert occupancy("sm_80", threads_per_block=1024, regs_per_thread=128).limiter == "does-not-fit"
    # Small blocks hit the 32-blocks-per-SM limit: 32 threads x 32 blocks = 32 warps = 50%.
    occ = occupancy("sm_80", threads_per_block=32, regs_per_thread=16)
    assert (occ.active, occ.limiter) == (32, "blocks")


def test_occupancy_gfx942_by_hand():
    # 94 VGPRs -> 96 (granule 8); 512 // 96 = 5 waves per SIMD; a 256-thread workgroup is 4 waves, one per
    # SIMD, so 5 workgroups per CU: 5 / 8 waves = 62.5%.
    occ = occupancy("gfx942", threads_per_block=256, regs_per_thread=94, shared_bytes=8192, sgprs=72)
    assert (occ.active, occ.blocks_per_sm, occ.limiter) == (5, 5, "registers")
    assert occ.fraction == pytest.approx(0.625)
    # 62 VGPRs -> 64: 8 waves (the maximum); a 512-thread workgroup is 8 waves, 2 per SIMD: 4 workgroups.
    occ = occupancy("gfx942", threads_per_block=512, regs_per_thread=62, shared_bytes=16384)
    assert (occ.active, occ.blocks_per_sm) == (8, 4)
    # LDS: 40 KiB per workgroup (granule 512 B) -> one workgroup of 4 waves per CU: 1 wave per SIMD.
    occ = occupancy("gfx942", threads_per_block=256, regs_per_thread=32, shared_bytes=40 * 1024)
    assert (occ.active, occ.limiter) == (1, "shared")
    # More than 100 SGPRs caps CDNA at 7 waves.
    assert occupancy("gfx942", threads_per_block=256, regs_per_thread=32, sgprs=102).active == 7


def test_occupancy_gfx1100_wave32_by_hand():
    # 167 VGPRs -> 168 (granule 24): 1536 // 168 = 9 waves per SIMD; 16 waves per workgroup over 4 SIMDs:
    # 9 * 4 // 16 = 2 workgroups -> 8 waves per SIMD of 16 = 50%.
    occ = occupancy("gfx1100", threads_per_block=512, regs_per_thread=167)
    assert (occ.blocks_per_sm, occ.active, occ.fraction) == (2, 8, 0.5)


def test_occupancy_rejects_bad_input():
    with pytest.raises(ValueError, match="threads_per_block must be an integer >= 1"):
        occupancy("sm_90", threads_per_block=0, regs_per_thread=32)
    with pytest.raises(ValueError, match="unknown architecture"):
        occupancy("sm_75", threads_per_block=32, regs_per_thread=32)


# ---------------------------------------------------------------------------------------------------
# Parsers: canned snippets for each syntax, then real compiler output.


def test_sass_widths_and_matrix_opcodes():
    sass = "\n".join([
        "        /*0100*/              @!P1 LDG.E.128 R4, desc[UR10][R14.64] ;",
        "        /*0110*/                   LDG.E.LTC128B.U16 R6, desc[UR10][R2.64] ;",
        "        /*0120*/                   STG.E desc[UR10][R2.64], R0 ;",
        "        /*0130*/                   STL [R1], R4 ;",
        "        /*0140*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;",
        "        /*0150*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;",
        "        /*0160*/                   UTCHMMA gdesc[UR8], gdesc[UR10], tmem[UR12] ;",
        "        /*0170*/                   RED.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R2.64], R5 ;",
    ])
    code = ip.parse_sass(sass)
    assert code.load_widths == {128: 1, 16: 1}  # LTC128B is a cache hint, not a width
    assert code.store_widths == {32: 1}
    assert (code.spill_count, code.atomics) == (1, 1)
    assert code.matrix_families == ["mma", "tcgen05", "wgmma"]


_SASS_LOOP = "\n".join([
    "        /*0000*/                   UTMALDG.2D [UR8], [UR4] ;                          /* 0x0000000008007db4 */",
    "        /*0010*/                   USETMAXREG.DEALLOC.CTAPOOL 0x18 ;                  /* 0x00000018000079c8 */",
    "        /*0020*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;             /* 0x000000100c08723c */",
    # The main loop: 0x30..0x90 (two HGMMA), with an inner loop without matrix instructions (0x50..0x60).
    "        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ; /* 0x41e0000004187 */",
    "        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;                    /* 0x00008000000079c5 */",
    "        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;                      /* 0x0000000000007b1d */",
    "        /*0060*/              @!P0 BRA 0x50 ;                                         /* 0xfffffff800cc8947 */",
    "        /*0070*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR8], R88, gsb0 ; /* 0x41e0000008587 */",
    "        /*0080*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;                    /* 0x00008000000079c5 */",
    "        /*0090*/              @P1 BRA 0x30 ;                                          /* 0xfffffff800cc8947 */",
    "        /*00a0*/                   BAR.ARV 0x1, 0x100 ;                               /* 0x0000000000007b1d */",
    "        /*00b0*/                   UTMASTG.2D [UR4], [UR8] ;                          /* 0x0000000008007db4 */",
    "        /*00c0*/                   BRA 0xc0;                                          /* 0xfffffffc00fc7947 */",
])


def test_sass_design_fields():
    """TMA, setmaxnreg, the main loop's smallest wgmma wait and its barriers, the narrowest matrix N."""
    code = ip.parse_sass(_SASS_LOOP)
    assert (code.tma_ops, code.setmaxnreg) == (2, 1)
    assert code.min_mma_n == 8  # HMMA.16816 is m16n8k16
    # Main loop 0x30..0x90: waits 1 and 0 -> 0; one BAR.SYNC (inside the nested plain loop); BAR.ARV is
    # outside and only arrives.
    assert (code.mma_wait_depth, code.loop_barriers) == (0, 1)
    no_loop = ip.parse_sass("\n".join(_SASS_LOOP.splitlines()[:3]))
    assert (no_loop.mma_wait_depth, no_loop.loop_barriers, no_loop.tma_ops) == (None, None, 1)


def test_tcgen05_shape_from_the_ptx_instruction_descriptor():
    # 136381584 = 0x08210490: N >> 3 = 16 (bits 17-22), M >> 4 = 8 (bits 24-28): m128n128.
    ptx = ("\tmov.b32 \t%r49, 136381584;\n"
           "\t@%p13 tcgen05.mma.cta_group::1.kind::f16 [ %r361 + 0 ], %rd20, %rd21, %r49, %p12;")
    assert ip.tcgen05_shapes(ptx) == [(128, 128)]
    assert ip.matrix_shape("UTCHMMA") is None
    assert ip.matrix_shape("HGMMA.64x256x16.F32.BF16") == (64, 256, 16)
    assert ip.matrix_shape("v_mfma_f32_32x32x8bf16_1k") == (32, 32, 8)


_AMDGCN_LOOP = """\
\t.amdhsa_code_object_version 5
_attn:
\tds_write_b16 v1, v2
\ts_branch .LBB0_2
.LBB0_1:                                ; %loop
\tds_read_u16 v3, v4
\tds_read_u16_d16_hi v3, v5
\tds_read2_b32 v[6:7], v8 offset1:1
\tds_read_b128 v[8:11], v12
\ts_barrier
\tv_mfma_f32_32x32x8_bf16 a[0:15], v[0:1], v[2:3], a[0:15]
\tv_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], a[0:3]
\ts_waitcnt lgkmcnt(0)
\ts_barrier
\ts_cbranch_scc1 .LBB0_1
.LBB0_2:
\tds_write_b128 v1, v[8:11]
\ts_endpgm
.Lfunc_end0:
\t.vgpr_count: 64
\t.sgpr_count: 20
"""


def test_amdgcn_design_fields():
    code = ip.parse_amdgcn(_AMDGCN_LOOP)
    assert code.narrow_lds_ops == 3  # ds_write_b16, ds_read_u16, ds_read_u16_d16_hi
    assert code.lds_read_widths == {16: 2, 64: 1, 128: 1}  # ds_read2_b32 moves 2 x 32 bits per lane
    assert code.lds_write_widths == {16: 1, 128: 1}
    assert code.mfma_shapes == ["16x16x16", "32x32x8"] and code.min_mma_n == 16
    assert code.loop_barriers == 2 and code.mma_wait_depth is None
    assert ip.amd_lds_access("ds_bpermute_b32") is None and ip.amd_lds_access("ds_load_u8") == ("read", 8)


@pytest.mark.parametrize(("suffix", "bits"), [("dwordx4", 128), ("dwordx2", 64), ("dword", 32), ("ushort", 16),
                                              ("short_d16_hi", 16), ("ubyte", 8), ("b128", 128), ("b32", 32),
                                              ("u16", 16), ("d16_b16", 16), ("lds_dwordx4", 128)])
def test_amd_access_widths(suffix, bits):
    assert ip.amd_access_bits(suffix) == bits


def test_amd_width_parser_rejects_unknown_suffixes():
    with pytest.raises(ValueError, match="unrecognised AMD memory instruction suffix 'xyzw'"):
        ip.amd_access_bits("xyzw")


def test_resource_usage_errors_clearly():
    with pytest.raises(ValueError, match="no 'Function"):
        ip.parse_resource_usage("nothing here")


def _copy_job(target, ptr=4096, n=1 << 20, dtype=torch.bfloat16):
    """1024 elements per block, 8 (16 bytes) per thread on 32- and 64-lane targets alike."""
    x = TensorProxy(dtype, ptr, n * 2)
    y = TensorProxy(dtype, 1 << 24, n * 2)
    warps = 1024 // 8 // runtime.get_arch(target).warp_size
    return _job(_kernels.copy_kernel, (x, y, n), {"BLOCK": 1024}, target, num_warps=warps)


@pytest.mark.parametrize("target", FAST_TARGETS)
def test_specialization_decides_vector_width(target):
    """Aligned pointers and a size divisible by 16 give 128-bit accesses; a 2-byte-misaligned pointer or an
    odd size does not: inspect compiles what the JIT would compile for the real arguments."""
    aligned, misaligned, odd = _compile(_copy_job(target), _copy_job(target, ptr=4098),
                                        _copy_job(target, n=(1 << 20) - 1))
    assert aligned.ok, aligned.error
    assert set(aligned.divisible_args) == {"x_ptr", "y_ptr", "n"}
    assert aligned.code.widest_load_bits == 128 and aligned.code.widest_store_bits == 128
    assert "x_ptr" not in misaligned.divisible_args
    assert misaligned.code.widest_load_bits < 128 and misaligned.code.widest_store_bits == 128
    assert "n" not in odd.divisible_args
    assert odd.code.widest_load_bits < 128 and odd.code.widest_store_bits < 128
    if target.startswith("sm_"):
        assert aligned.code.regs > 0 and aligned.ptx_load_widths == {128: 1}
    else:
        assert aligned.code.sgprs > 0


def test_int_one_specializes_as_constexpr():
    (res,) = _compile(_job(_kernels.copy_kernel, (TensorProxy(torch.float32, 0, 4), TensorProxy(torch.float32, 64, 4),
                                                 1), {"BLOCK": 128}, "sm_90"))
    assert res.ok and res.signature["n"] == "constexpr"


def _dot_job(target):
    a = TensorProxy(torch.bfloat16, 1 << 20, 1 << 20)
    c = TensorProxy(torch.float32, 1 << 22, 1 << 20)
    return _job(_kernels.dot_kernel, (a, a, c, 256), {"BM": 128, "BN": 128, "BK": 32}, target, num_warps=4,
                num_stages=2)


MIN_N = {"sm_80": 8, "sm_90": 128, "sm_100": 128, "gfx90a": 32, "gfx942": 32, "gfx1100": 16}
MATRIX = {"sm_80": "mma", "sm_90": "wgmma", "sm_100": "tcgen05", "gfx90a": "mfma", "gfx942": "mfma",
          "gfx1100": "wmma"}


@pytest.mark.parametrize("target", [pytest.param(t, marks=[] if t in FAST_TARGETS else [pytest.mark.slow])
                                    for t in runtime.DEFAULT_TARGETS])
def test_matrix_instructions_detected(target):
    (res,) = _compile(_dot_job(target))
    assert res.ok, res.error
    assert res.code.matrix_families == [MATRIX[target]], res.code.matrix_ops
    assert res.uses_dot
    # The K loop is the main loop; the narrowest instruction is the target's for a 128x128 fp32 tile.
    assert res.code.min_mma_n == MIN_N[target] and res.code.loop_barriers is not None
    assert res.code.mma_wait_depth == (1 if target == "sm_90" else None)  # wgmma pipelined across k-steps
    (copy,) = _compile(_copy_job(target))
    assert copy.code.matrix_families == [] and copy.uses_dot is False


def test_compile_failure_is_reported_not_raised():
    job = _job(_kernels.copy_kernel, (None, None, 16), {"BLOCK": 100}, "sm_90")  # BLOCK not a power of 2
    (res,) = _compile(job)
    assert not res.ok and "power of 2" in res.error.lower()


# ---------------------------------------------------------------------------------------------------
# The registry walk.


def test_capture_at_bench_shape_records_without_running():
    spec = REGISTRY["rms_norm"]
    case = spec.bench_cases[0]
    n_rows, n_cols = case.dims["n_rows"], case.dims["n_cols"]
    with runtime.assume_target("gfx942", 304):
        captured = capture(spec, case, torch.bfloat16, execute=False, cheap=True)
    (fwd,), (bwd,) = captured.launches["fwd"], captured.launches["bwd"]
    assert fwd.grid == (n_rows,) and fwd.args[0].shape == (n_rows, n_cols)
    assert fwd.options["num_warps"] == 4  # 4096 bf16 columns, 16 B per thread on 64-lane waves
    per_program = -(-n_rows // (304 * runtime.PERSISTENT_PROGRAMS_PER_SM))  # MI300X: 304 CUs
    assert bwd.grid == (-(-n_rows // per_program),)
    job = job_for(fwd, "gfx942")
    assert job.args[0].ptr_range() == n_rows * n_cols * 2


@pytest.fixture(scope="module")
def rms_report():
    return inspect_ops(["rms_norm"], FAST_TARGETS, cases=lambda spec: spec.bench_cases[:1])


def test_inspect_rows_for_one_op(rms_report):
    assert [r.key for r in rms_report.rows] == [
        f"rms_norm/{m}/llama3-8b_hidden/_norm_{m}_kernel@{t}" for m in ("bwd", "fwd") for t in FAST_TARGETS]
    for r in rms_report.rows:
        assert r.ok, r.error
        assert not r.spills
        assert (r.widest_load_bits, r.widest_store_bits) == (128, 128), r.key
        assert 0 < r.occupancy <= 1 and r.threads_per_block == r.num_warps * runtime.get_arch(r.target).warp_size
        assert {"x_ptr", "n_cols"} <= set(r.divisible_args)
    doc = rms_report.as_dict()
    assert doc["schema"] == "wavefront.inspect/1" and doc["n_failed"] == 0
    assert type(rms_report).from_dict(doc).rows[0].key == rms_report.rows[0].key


def test_inspect_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        inspect_ops(["nope"], ["sm_90"])
    with pytest.raises(ValueError, match="'cpu' is not a GPU target"):
        inspect_ops(["rms_norm"], ["cpu"])


@pytest.mark.slow
def test_whole_registry_on_every_target_is_vectorized_and_spill_free():
    """The acceptance check of the kernel fixes: every kernel compiles for wave32 and wave64 targets, with
    128-bit loads and stores and no spills at its bench shapes."""
    report = inspect_ops()
    assert {r.target for r in report.rows} == set(runtime.DEFAULT_TARGETS)
    bad = [(r.key, r.error or f"spill {r.spill_bytes} ld {r.widest_load_bits} st {r.widest_store_bits}")
           for r in report.rows if not r.ok or r.spills or r.widest_load_bits < 128 or r.widest_store_bits < 128]
    assert not bad, bad


def test_inspect_cli_json_and_errors(tmp_path):
    import json

    from typer.testing import CliRunner

    from wavefront.cli import build_app

    out = tmp_path / "inspect.json"
    result = CliRunner().invoke(build_app(), ["inspect", "--op", "softmax", "--targets", "gfx942", "--json",
                                              str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wavefront.inspect/1" and doc["targets"] == ["gfx942"]
    assert len(doc["rows"]) == 2 * len(REGISTRY["softmax"].bench_cases) and doc["n_failed"] == 0
    words = " ".join(result.output.split())  # the summary wraps at narrow terminals: compare words
    assert "softmax fwd" in words and "0 with spills" in words
    # The table, its legend and the summary: never a line past the terminal's width (words wrap whole).
    from wavefront.cli._output import console

    assert max(len(line) for line in result.stdout.splitlines()) <= console.width
    assert "-: none (ld/st: no plain global load/store" in " ".join(result.stdout.split())
    bad = CliRunner().invoke(build_app(), ["inspect", "--targets", "sm_75"])
    assert bad.exit_code == 2 and "unknown target 'sm_75'" in bad.output
    bad = CliRunner().invoke(build_app(), ["inspect", "--op", "nope"])
    assert bad.exit_code == 2 and "unknown op 'nope'" in bad.output


def test_amdgcn_metadata_reads_the_first_key_of_the_kernel_map():
    """The code object's YAML kernel list starts each kernel's map with a dash on its first key (LLVM writes
    `.agpr_count` first): every metadata key is read wherever it sits in the map."""
    meta = ("  - .agpr_count:     12\n    .group_segment_fixed_size: 4096\n    .private_segment_fixed_size: 0\n"
            "    .sgpr_count:     45\n    .sgpr_spill_count: 0\n    .vgpr_count:     61\n    .vgpr_spill_count: 0\n")
    code = ip.parse_amdgcn("kernel:\n  s_endpgm\n" + meta)
    assert (code.agprs, code.sgprs, code.regs, code.spill_bytes) == (12, 45, 61, 0)
    first = meta.replace("  - .agpr_count:     12\n", "    .agpr_count:     12\n").replace(
        "    .vgpr_count:     61\n", "  - .vgpr_count:     61\n")
    assert ip.parse_amdgcn("kernel:\n  s_endpgm\n" + first).regs == 61
