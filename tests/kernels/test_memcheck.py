"""Memcheck (wavefront.memcheck) catches planted out-of-bounds loads, stores, atomics and tensor-descriptor blocks
in small user-style kernels, with the kernel, program id, operation, offsets and extent; masked-off lanes and
descriptor blocks clipped at the tensor's shape are exempt; a real wavefront op passes; and nothing is installed
while it is off."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import wavefront
from wavefront import memcheck, runtime

pytestmark = pytest.mark.skipif(not runtime.interpreting(), reason="memcheck checks interpreted kernels")


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, STORE_LIMIT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    else:
        x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x, mask=offs < n + STORE_LIMIT)


@triton.jit
def _histogram(idx_ptr, counts_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    live = offs < n
    i = tl.load(idx_ptr + offs, mask=live, other=0)
    ptrs = counts_ptr + i
    one = tl.full((BLOCK,), 1, tl.int32)
    if OP == "cas":  # no mask: masked-off lanes go to slot 0
        tl.atomic_cas(tl.where(live, ptrs, counts_ptr), tl.zeros((BLOCK,), tl.int32), one)
    else:  # interpreter only (as this whole file): tl.atomic_<OP> looked up when the program runs
        getattr(tl, "atomic_" + OP)(ptrs, one, mask=live)


@triton.jit
def _tile_copy(x_ptr, y_ptr, M, N, ROWS_DECLARED, BM: tl.constexpr, BN: tl.constexpr):
    # x and y are [M, N] row-major; the descriptors claim ROWS_DECLARED rows
    src = tl.make_tensor_descriptor(x_ptr, shape=[ROWS_DECLARED, N], strides=[N, 1], block_shape=[BM, BN])
    dst = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    row, col = tl.program_id(0) * BM, tl.program_id(1) * BN
    dst.store([row, col], src.load([row, col]))


@triton.jit
def _host_desc_fill(desc, BM: tl.constexpr, BN: tl.constexpr):
    desc.store([tl.program_id(0) * BM, 0], tl.full((BM, BN), 7.0, tl.float32))


def test_out_of_bounds_load_names_kernel_program_op_offset_and_extent():
    x, y = torch.randn(100), torch.zeros(100)
    with memcheck.checking(), pytest.raises(wavefront.MemcheckError) as info:
        _copy[(4,)](x, y, 100, BLOCK=32, MASK_LOAD=False, STORE_LIMIT=0)
    err = info.value
    assert isinstance(err, memcheck.MemcheckError) and isinstance(err, RuntimeError)
    assert (err.kernel, err.pid, err.op, err.argument) == ("_copy", (3, 0, 0), "load", "x_ptr")
    assert err.offsets == list(range(100, 108)) and err.n_bad == 28  # lanes 100..127 of the last program
    assert (err.extent.numel, err.extent.shape, err.extent.dtype) == (100, (100,), "float32")
    assert err.extent.end - err.extent.start == 400
    for part in ("_copy", "(3, 0, 0)", "load", "x_ptr", "100", "float32"):
        assert part in str(err)


def test_masked_off_lanes_are_exempt():
    x, y = torch.randn(100), torch.zeros(100)
    with memcheck.checking():
        _copy[(4,)](x, y, 100, BLOCK=32, MASK_LOAD=True, STORE_LIMIT=0)
    torch.testing.assert_close(y, x, rtol=0, atol=0)


def test_off_by_one_store_is_caught_and_nothing_is_written_out_of_bounds():
    x, y = torch.randn(100), torch.zeros(100)
    with memcheck.checking(), pytest.raises(wavefront.MemcheckError) as info:
        _copy[(4,)](x, y, 100, BLOCK=32, MASK_LOAD=True, STORE_LIMIT=1)  # mask offs < n + 1
    err = info.value
    assert (err.kernel, err.pid, err.op, err.argument, err.offsets, err.n_bad) == ("_copy", (3, 0, 0), "store",
                                                                                    "y_ptr", [100], 1)


def test_overflow_into_a_neighbouring_argument_is_caught():
    """Two separate storages back to back: an overflow of x lands inside y. Memcheck moves each storage between
    red zones for the run, so the overflow is still reported, against x."""
    backing = np.zeros(128, dtype=np.float32)
    x, y = torch.from_numpy(backing[:64]), torch.from_numpy(backing[64:])
    assert x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    assert x.data_ptr() + 64 * 4 == y.data_ptr()
    with memcheck.checking(), pytest.raises(wavefront.MemcheckError) as info:
        _copy[(2,)](x, y, 64, BLOCK=64, MASK_LOAD=False, STORE_LIMIT=0)
    assert (info.value.argument, info.value.pid, info.value.offsets[0]) == ("x_ptr", (1, 0, 0), 64)


@pytest.mark.parametrize("op", ["add", "max", "min", "and", "or", "xor", "xchg", "cas"])
def test_atomic_out_of_bounds_is_caught_for_every_kind(op):
    n_bins = 4
    idx = torch.tensor([0, 3, 1, n_bins, 2], dtype=torch.int32)  # index n_bins: one past the last bin
    counts = torch.zeros(n_bins, dtype=torch.int32)
    with memcheck.checking(), pytest.raises(wavefront.MemcheckError) as info:
        _histogram[(1,)](idx, counts, idx.numel(), OP=op, BLOCK=8)
    err = info.value
    assert (err.kernel, err.pid, err.op, err.argument) == ("_histogram", (0, 0, 0), f"atomic_{op}", "counts_ptr")
    assert err.offsets == [n_bins] and err.n_bad == 1 and err.extent.numel == n_bins
    assert counts.tolist() == [0] * n_bins, "the run stops before the offending access"


def test_atomics_in_bounds_pass():
    idx = torch.tensor([0, 3, 1, 3, 2], dtype=torch.int32)
    counts = torch.zeros(4, dtype=torch.int32)
    with memcheck.checking():
        _histogram[(1,)](idx, counts, idx.numel(), OP="add", BLOCK=8)
    assert counts.tolist() == [1, 1, 1, 2]


def test_descriptor_blocks_past_the_shape_are_legal():
    """TMA clips stores and zero-fills loads outside the descriptor's shape: a 20 x 24 tensor in 16 x 16 tiles."""
    x, y = torch.randn(20, 24), torch.zeros(20, 24)
    with memcheck.checking():
        _tile_copy[(2, 2)](x, y, 20, 24, 20, BM=16, BN=16)
    torch.testing.assert_close(y, x, rtol=0, atol=0)


def test_descriptor_larger_than_its_storage_is_caught():
    x, y = torch.randn(20, 24), torch.zeros(20, 24)
    with memcheck.checking(), pytest.raises(wavefront.MemcheckError) as info:
        _tile_copy[(2, 2)](x, y, 20, 24, 24, BM=16, BN=16)  # x's descriptor claims 24 rows
    err = info.value
    assert (err.kernel, err.pid, err.op, err.argument) == ("_tile_copy", (1, 0, 0), "descriptor load", "x_ptr")
    assert err.offsets[0] == 20 * 24 and err.extent.shape == (20, 24)  # row 20, column 0: one row past the end


def test_host_tensor_descriptor_store_past_its_storage_is_caught():
    y = torch.zeros(20, 16)
    ok = TensorDescriptor(y, shape=[20, 16], strides=[16, 1], block_shape=[8, 16])
    with memcheck.checking():
        _host_desc_fill[(3,)](ok, BM=8, BN=16)
    assert bool((y == 7.0).all())
    wrong = TensorDescriptor(y, shape=[24, 16], strides=[16, 1], block_shape=[8, 16])
    with memcheck.checking(), pytest.raises(wavefront.MemcheckError) as info:
        _host_desc_fill[(3,)](wrong, BM=8, BN=16)
    err = info.value
    assert (err.op, err.argument, err.pid, err.offsets[0], err.n_bad) == ("descriptor store", "desc.base",
                                                                          (2, 0, 0), 320, 64)


@triton.jit
def _gather_rows(x_ptr, idx_ptr, out_ptr, ROWS_DECLARED, N: tl.constexpr, R: tl.constexpr):
    desc = tl.make_tensor_descriptor(x_ptr, shape=[ROWS_DECLARED, N], strides=[N, 1], block_shape=[1, N])
    v = desc.gather(tl.load(idx_ptr + tl.arange(0, R)), 0)
    tl.store(out_ptr + tl.arange(0, R)[:, None] * N + tl.arange(0, N)[None, :], v)


def test_descriptor_gather_rows_past_the_shape_are_zero_and_past_the_storage_are_caught():
    x, out = torch.randn(20, 16), torch.full((8, 16), 5.0)
    idx = torch.tensor([0, 19, 22, 3, 1, 2, 4, 5], dtype=torch.int32)  # row 22: outside the 20-row shape
    with memcheck.checking():
        _gather_rows[(1,)](x, idx, out, 20, N=16, R=8)
        expected = x[idx.clamp(max=19).long()]
        expected[2] = 0.0
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        with pytest.raises(wavefront.MemcheckError) as info:
            _gather_rows[(1,)](x, idx, out, 24, N=16, R=8)  # the descriptor claims 24 rows
    err = info.value
    assert (err.op, err.argument, err.offsets[0], err.n_bad) == ("descriptor gather", "x_ptr", 22 * 16, 16)


@triton.jit
def _via_table(table_ptr, out_ptr, N: tl.constexpr):
    src = tl.load(table_ptr).to(tl.pointer_type(tl.float32))  # an address stored in memory, not an argument
    tl.store(out_ptr + tl.arange(0, N), tl.load(src + tl.arange(0, N)))


def test_tensors_reached_through_an_address_table_are_declared_with_indirect():
    x, out = torch.randn(8), torch.zeros(8)
    table = torch.tensor([x.data_ptr()], dtype=torch.int64)
    with memcheck.checking(), pytest.raises(wavefront.MemcheckError):
        _via_table[(1,)](table, out, N=8)  # x is no argument: its memory is outside every extent
    with memcheck.checking(), memcheck.indirect({"x": [x]}):
        _via_table[(1,)](table, out, N=8)
    torch.testing.assert_close(out, x, rtol=0, atol=0)


def test_a_wavefront_op_passes():
    x, w = torch.randn(5, 48), torch.randn(48)
    with memcheck.checking():
        y = wavefront.ops.rms_norm(x, w)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@triton.jit
def _accumulate(src_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out_ptr + o, tl.load(out_ptr + o) + tl.load(src_ptr + o))


@triton.jit
def _write_first_half(out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out_ptr + o, tl.zeros((N,), tl.float32), mask=o < N // 2)


def test_initcheck_reports_reads_of_memory_nothing_has_written():
    src = torch.randn(8)
    with memcheck.checking(initcheck=True):
        out = torch.empty(8)
        with pytest.raises(wavefront.MemcheckError) as info:
            _accumulate[(1,)](src, out, N=8)
        err = info.value
        assert (err.kind, err.kernel, err.op, err.argument, err.offsets) == ("uninitialized", "_accumulate", "load",
                                                                             "out_ptr", list(range(8)))
        assert "initcheck" in str(err)
        out.zero_()  # written by a torch op: fine
        _accumulate[(1,)](src, out, N=8)
        torch.testing.assert_close(out, src, rtol=0, atol=0)
        half = torch.empty_like(src)
        _write_first_half[(1,)](half, N=8)  # written by a kernel: only the first half
        with pytest.raises(wavefront.MemcheckError) as info:
            _accumulate[(1,)](src, half, N=8)
        assert info.value.kind == "uninitialized" and info.value.offsets == [4, 5, 6, 7]


def test_initcheck_reports_atomics_on_unwritten_memory():
    idx = torch.tensor([0, 3, 1, 3, 2], dtype=torch.int32)
    with memcheck.checking(initcheck=True):
        counts = torch.zeros(4, dtype=torch.int32)
        _histogram[(1,)](idx, counts, idx.numel(), OP="add", BLOCK=8)
        assert counts.tolist() == [1, 1, 1, 2]
        counts = torch.empty(4, dtype=torch.int32)  # forgot to zero the counters
        with pytest.raises(wavefront.MemcheckError) as info:
            _histogram[(1,)](idx, counts, idx.numel(), OP="add", BLOCK=8)
        assert (info.value.kind, info.value.op, info.value.offsets) == ("uninitialized", "atomic_add", [0, 3, 1, 3, 2])


@pytest.mark.no_memcheck
def test_off_means_no_hook_installed():
    from triton.runtime import interpreter

    builder, grid = interpreter.InterpreterBuilder, interpreter.GridExecutor
    def hooks():
        return (builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw,
                builder.create_descriptor_load, grid.__call__, grid._init_args_hst, torch.empty, torch.empty_like,
                torch.Tensor.new_empty)

    before = hooks()
    assert not memcheck.enabled()
    with memcheck.checking():
        assert memcheck.enabled() and builder.create_masked_load is not before[0] and torch.empty is before[6]
        with memcheck.checking(initcheck=True):  # nested: the outer scope keeps it on
            assert torch.empty is not before[6]
        assert memcheck.enabled() and torch.empty is before[6]
    assert not memcheck.enabled()
    assert hooks() == before


def test_the_suite_runs_under_memcheck(request):
    assert memcheck.enabled() == (request.config.wavefront_memcheck is not None)


def test_environment_variable_checks_a_users_own_kernel(tmp_path):
    """WAVEFRONT_MEMCHECK=1 and an import of wavefront.memcheck: a script's own kernel is checked."""
    import os
    import subprocess
    import sys

    script = tmp_path / "user.py"
    script.write_text(
        "import torch, triton, triton.language as tl\n"
        "import wavefront.memcheck\n"
        "@triton.jit\n"
        "def mine(x_ptr, N: tl.constexpr):\n"
        "    tl.store(x_ptr + tl.arange(0, N), tl.zeros((N,), tl.float32))\n"
        "try:\n"
        "    mine[(1,)](torch.empty(7), N=8)\n"
        "except wavefront.memcheck.MemcheckError as e:\n"
        "    print('caught', e.kernel, e.op, e.offsets)\n")
    env = {**os.environ, "TRITON_INTERPRET": "1", "WAVEFRONT_MEMCHECK": "1"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "caught mine store [7]", out.stdout + out.stderr
    bad = subprocess.run([sys.executable, "-c", "import wavefront.memcheck"], capture_output=True, text=True,
                         env={**env, "WAVEFRONT_MEMCHECK": "yes please"}, timeout=120)
    assert bad.returncode != 0 and "WAVEFRONT_MEMCHECK='yes please': expected 0, 1 or init" in bad.stderr
