"""Row kernels in the machine code: block-wide barriers per row pass (parsed from SASS/AMDGCN, and read from
the softmax kernels compiled for sm_90 and gfx942)."""

from __future__ import annotations

import re

import pytest

from wavefront.workbench.static import parse as ip
from wavefront.workbench.static.inspect import inspect_ops

FAST_TARGETS = ("sm_90", "gfx942")


def _sass(lines: list[tuple[int, str]]) -> str:
    return "\n".join(f"        /*{addr:04x}*/                   {text} ;    /* 0x0000000000000000 */"
                     for addr, text in lines)


# A wide-row kernel as the old softmax compiled: a statistics loop with two reductions (4 barriers), then
# a loop writing the row (none); straight-line code has one more barrier outside both loops.
_WIDE = _sass([
    (0x00, "BAR.SYNC.DEFER_BLOCKING 0x0"),
    (0x10, "LDG.E.128 R4, desc[UR8][R20.64]"),
    (0x20, "BAR.SYNC.DEFER_BLOCKING 0x0"),
    (0x30, "BAR.SYNC.DEFER_BLOCKING 0x0"),
    (0x40, "BAR.RED.POPC.DEFER_BLOCKING 0x0, P0"),
    (0x50, "BAR.SYNC.DEFER_BLOCKING 0x0"),
    (0x60, "@!P0 BRA 0x10"),
    (0x70, "LDG.E.128 R4, desc[UR8][R22.64]"),
    (0x80, "BAR.ARV 0x1, 0x100"),
    (0x90, "STG.E.128 desc[UR8][R20.64], R4"),
    (0xa0, "@!P0 BRA 0x70"),
    (0xb0, "EXIT"),
    (0xc0, "BRA 0xc0"),
])


def test_row_pass_barriers_from_sass():
    code = ip.parse_sass(_WIDE)
    # Loop 0x10..0x60: 3 BAR.SYNC + 1 BAR.RED; the write loop: BAR.ARV only arrives; outside: 1.
    assert code.row_pass_barriers == 4
    # A row held in registers: the barriers of the whole (loop-free) code.
    straight = ip.parse_sass(_sass([(0x00, "BAR.SYNC.DEFER_BLOCKING 0x0"), (0x10, "BAR.SYNC.DEFER_BLOCKING 0x0"),
                                     (0x20, "EXIT"), (0x30, "BRA 0x30")]))
    assert straight.row_pass_barriers == 2
    # Kernels with matrix instructions are not row kernels: the field is not applicable.
    mma = ip.parse_sass(_sass([(0x00, "HMMA.16816.F32.BF16 R8, R12, R16, R8"), (0x10, "EXIT")]))
    assert mma.row_pass_barriers is None


_AMDGCN = """\
\t.amdhsa_code_object_version 5
_row:
\ts_barrier
.LBB0_1:                                ; %loop
\tglobal_load_dwordx4 v[0:3], v[4:5], off
\ts_barrier
\ts_barrier
\ts_cbranch_scc1 .LBB0_1
\ts_endpgm
.Lfunc_end0:
\t.vgpr_count: 32
\t.sgpr_count: 20
"""


def test_row_pass_barriers_from_amdgcn():
    code = ip.parse_amdgcn(_AMDGCN)
    assert code.row_pass_barriers == 2  # the loop's two, more than the one outside it
    assert ip.parse_amdgcn(_AMDGCN.replace("\ts_barrier\n\ts_barrier\n", "")).row_pass_barriers == 1


@pytest.fixture(scope="module")
def softmax_report():
    # attn_scores_4k: the row in registers; vocab_128k: a wide row, looped.
    return inspect_ops(["softmax"], FAST_TARGETS,
                       cases=lambda spec: [c for c in spec.bench_cases if c.name in ("attn_scores_4k", "vocab_128k")])


def test_softmax_has_one_barrier_per_row_pass(softmax_report):
    """The issue's design target: the statistics (max and sum) in one cross-warp exchange, none inside a
    wide row's loop (the kernel before this change had 3 per row and 4 per 8192-column block)."""
    rows = softmax_report.rows
    assert len(rows) == 2 * 2 * len(FAST_TARGETS)
    for r in rows:
        assert r.ok, r.error
        assert r.num_warps > 1, r.key  # a cross-warp reduction is present, so one barrier is the floor
        assert r.row_pass_barriers == 1, r.key
        assert (r.widest_load_bits, r.widest_store_bits) == (128, 128), r.key
        assert not r.spills, r.key


def _loop_body(sass: str) -> list[str]:
    """Opcode+operand text of the body of the listing's last backward branch before EXIT (the row loop)."""
    lines = [(int(m[1], 16), m[2].strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    back = [(addr, int(t, 16)) for addr, text in lines
            for t in re.findall(r"BRA (?:`\()?0x([0-9a-f]+)", text) if int(t, 16) < addr]
    end, start = max(back)  # the persistent row loop closes last
    return [text for addr, text in lines if start <= addr <= end]


def test_norm_backward_prefetches_the_next_row_on_nvidia(tmp_path):
    """The persistent row loop of the norm backward (RMSNorm, 4096 columns, sm_90) is software-pipelined:
    rows are copied to shared memory by cp.async (LDGSTS) two rows ahead, and the wait before row r's
    first barrier and reduction leaves the next row's copies in flight (DEPBAR.LE SB0, N with N >= 1)."""
    report = inspect_ops(["rms_norm"], ["sm_90"], asm_dir=tmp_path,
                         cases=lambda spec: [c for c in spec.bench_cases if c.name == "llama3-8b_hidden"])
    (bwd,) = [r for r in report.rows if r.mode == "bwd"]
    assert bwd.ok and not bwd.spills and bwd.occupancy == 0.5, bwd  # the baseline's occupancy, kept
    (sass_file,) = tmp_path.glob("_norm_bwd_kernel.sm_90.*.sass")
    body = _loop_body(sass_file.read_text())
    copies = [i for i, t in enumerate(body) if "LDGSTS" in t]
    waits = [i for i, t in enumerate(body) if "DEPBAR.LE SB0" in t]
    bars = [i for i, t in enumerate(body) if t.startswith("BAR.SYNC")]
    assert len(copies) >= 2 and waits and bars, body
    depth = int(body[waits[0]].rsplit(",", 1)[1].strip(), 0)
    assert depth >= 1  # row r + 1's copies are still in flight when row r is consumed
    assert waits[0] < bars[0]  # the wait precedes row r's barriers and reductions
    assert copies[-1] > bars[-1]  # row r + 2's copies are issued in the same iteration, after row r's barriers
