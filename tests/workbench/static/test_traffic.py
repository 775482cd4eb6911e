"""Traffic: exact on hand-computable kernels, eager's aten bytes, and the registry walk."""

from __future__ import annotations

import _kernels
import numpy as np
import pytest
import torch

from wavefront.kernels._launch import launch, recording
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case
from wavefront.workbench.bench.correctness import check_case
from wavefront.workbench.static import traffic as tr


def _run(kernel, grid, *args, **constexprs):
    with recording(execute=True) as launches, tr.counting(launches) as counter:
        launch(kernel, grid, *args, constexprs=constexprs, options={"num_warps": 4})
    (la,) = launches
    return tr.summarize_launch(la, counter.by_launch.get(id(la)))


def test_union_bytes():
    starts = np.array([0, 10, 5, 100, 100], dtype=np.int64)
    sizes = np.array([8, 4, 4, 2, 4], dtype=np.int64)
    assert tr.union_bytes(starts, sizes) == 9 + 4 + 4  # [0, 9), [10, 14) and [100, 104)
    assert tr.union_bytes(np.empty(0, np.int64), np.empty(0, np.int64)) == 0


def test_copy_kernel_counts_exact_bytes():
    n = 4096
    x = torch.randn(n, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    k = _run(_kernels.copy_kernel, (n // 1024,), x, y, n, BLOCK=1024)
    assert torch.equal(x, y)
    assert (k.loaded_bytes, k.stored_bytes, k.atomic_bytes) == (2 * n, 2 * n, 0)
    assert k.unique_bytes == 4 * n
    by_arg = {t.arg: t for t in k.tensors}
    assert (by_arg["x_ptr"].loaded_bytes, by_arg["x_ptr"].stored_bytes) == (2 * n, 0)
    assert (by_arg["y_ptr"].loaded_bytes, by_arg["y_ptr"].stored_bytes) == (0, 2 * n)


def test_masked_tail_counts_only_active_lanes():
    n = 1000  # one block of 1024 lanes, 24 masked off
    x = torch.randn(n, dtype=torch.float32)
    y = torch.empty_like(x)
    k = _run(_kernels.copy_kernel, (1,), x, y, n, BLOCK=1024)
    assert (k.loaded_bytes, k.stored_bytes) == (4 * n, 4 * n)
    assert {t.arg: t.extent_bytes for t in k.tensors} == {"x_ptr": 4 * n, "y_ptr": 4 * n}


def test_rereads_count_in_requested_not_in_unique():
    n = 3000
    x = torch.randn(n, dtype=torch.float16)
    y = torch.empty_like(x)
    k = _run(_kernels.read_twice_kernel, (3,), x, y, n, BLOCK=1024)
    torch.testing.assert_close(y, x + x.flip(0))
    assert k.loaded_bytes == 2 * 2 * n and k.stored_bytes == 2 * n
    x_row = next(t for t in k.tensors if t.arg == "x_ptr")
    assert (x_row.loaded_bytes, x_row.unique_bytes) == (4 * n, 2 * n)
    assert k.unique_bytes == 4 * n


def test_atomics_are_counted():
    n = 2048
    x = torch.ones(n, dtype=torch.float32)
    total = torch.zeros(4, dtype=torch.float32)
    k = _run(_kernels.atomic_add_kernel, (2,), x, total, n, BLOCK=1024)
    assert total.sum().item() == n
    assert (k.loaded_bytes, k.atomic_bytes) == (4 * n, 4 * n)
    assert next(t for t in k.tensors if t.arg == "total_ptr").unique_bytes == 16


def test_counter_restores_the_interpreter():
    from triton.runtime import interpreter

    before = interpreter.InterpreterBuilder.create_masked_load
    with tr.counting([]):
        assert interpreter.InterpreterBuilder.create_masked_load is not before
    assert interpreter.InterpreterBuilder.create_masked_load is before


def test_aten_bytes_of_eager_ops():
    a = torch.randn(64, 32)
    b = torch.randn(32)
    with tr.AtenBytes() as counted:
        c = a * b  # reads 64*32*4 + 32*4, writes 64*32*4
        c.add_(1.0)  # reads and writes c
        d = c.view(32, 64).t()  # views move nothing
        torch.empty(1000)  # allocation moves nothing
        d.zero_()  # write only
    nbytes = 64 * 32 * 4
    assert counted.read_bytes == nbytes + 32 * 4 + nbytes
    assert counted.written_bytes == nbytes + nbytes + nbytes
    assert tr.tensor_bytes(b.expand(64, 32)) == 32 * 4  # broadcast reads each element once


def test_traffic_of_one_case_against_the_minimum():
    spec = REGISTRY["rms_norm"]
    case = Case("t", "traffic test", {"n_rows": 16, "n_cols": 1024})
    fwd, bwd = tr.traffic_rows(spec, case, torch.bfloat16)
    n = 16 * 1024
    # Forward: x read, y written, rstd written (4 B/row), w (2 KiB) read by each of the 16 row programs.
    assert fwd.kernel_bytes == 2 * n + 2 * n + 16 * 4 + 16 * 1024 * 2
    assert fwd.unique_bytes == fwd.min_bytes == 2 * n + 2 * n + 16 * 4 + 1024 * 2
    assert fwd.host_bytes == 0 and fwd.marginal_ratio == pytest.approx(1.5, abs=0.01)
    # Backward: x, dy read, dx written: exactly the minimum per row; fixed per-program costs cancel.
    assert bwd.marginal_ratio == pytest.approx(1.0, abs=1e-3)
    assert bwd.host_bytes > 0  # the host-side sum of the dw partials
    assert fwd.eager_bytes > 2 * fwd.bytes_moved and bwd.ratio_eager > 2
    doc = tr.TrafficReport([fwd, bwd], "bf16").as_dict()
    assert doc["schema"] == "wavefront.traffic/1"
    assert tr.TrafficReport.from_dict(doc).rows[1].kernel_bytes == bwd.kernel_bytes


def test_wide_rows_read_twice_and_stay_correct():
    """Rows past the single-pass limit with several rows per persistent program: the two-phase backward
    reads x and dy twice (10n B per row against 6n B) and still matches the float64 reference."""
    spec = REGISTRY["layer_norm"]
    case = Case("wide_rows", "9000 columns, 21 rows: 3 rows per program on the two-phase path",
                {"n_rows": 21, "n_cols": 9000})
    assert check_case(spec, case, torch.float32).passed
    fwd, bwd = tr.traffic_rows(spec, case, torch.bfloat16)
    assert bwd.marginal_ratio == pytest.approx(10 / 6, rel=0.01)
    # The forward holds 9000 columns in one pass: x once, but w and b once per row program: 8n over 4n.
    assert fwd.marginal_ratio == pytest.approx(2.0, rel=0.01)


def test_traffic_cases_keep_widths():
    spec = REGISTRY["softmax"]
    cases = tr.traffic_cases(spec)
    assert [c.dims["n_cols"] for c in cases] == [c.dims["n_cols"] for c in spec.bench_cases]
    assert all(tr.MIN_TRAFFIC_ROWS <= c.dims["n_rows"] <= 64 for c in cases)


def test_errors_are_reported_per_row():
    spec = REGISTRY["softmax"]
    bad = Case("bad", "a layout the input maker does not know", {"n_rows": 4, "n_cols": 8}, layout="zigzag")
    rows = tr.traffic_rows(spec, bad, torch.float32)
    assert [r.mode for r in rows] == ["fwd", "bwd"]
    assert all("unknown layout" in r.error for r in rows)
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        tr.traffic_ops(["nope"])


def test_counts_do_not_depend_on_what_ran_before():
    """A launcher-side cache (AdamW's device tables, keyed by tensor addresses) must not make a case's bytes
    depend on the previous case: a hit skips the table upload, and whether the allocator reuses an address
    is chance. Every case starts cold (kernels._launch.reset_caches), so an entry left by an earlier case
    is gone and the counts repeat."""
    from wavefront.kernels import adamw as adamw_kernels

    spec = REGISTRY["adamw_step"]
    case = tr.traffic_cases(spec)[-1]

    def total() -> int:
        count = tr.measure_case(spec, case, torch.bfloat16, eager=False)["fwd"][0]
        return count.kernel_bytes + count.host_bytes

    first = total()
    adamw_kernels.TABLES._tables[("left", "by", "an earlier case")] = None  # what a previous case leaves
    assert total() == first
    assert ("left", "by", "an earlier case") not in adamw_kernels.TABLES._tables
