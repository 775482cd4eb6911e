"""The shard-statistics kernel (kernels/vocab_parallel.py) against its PyTorch twin, one process: every
option, a column slice in the middle of the vocabulary, ignored rows, the block loop, and an out-of-range
target, which poisons its row with NaN instead of reading out of bounds."""

from __future__ import annotations

import pytest
import torch

from wavefront import reference, runtime

pytestmark = pytest.mark.skipif(not runtime.uses_triton(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs the Triton interpreter or a GPU")


def _kernel(*args, **kw):
    from wavefront.kernels.vocab_parallel import vocab_shard_stats

    return vocab_shard_stats(*args, **kw)


CASES = [
    # name, rows, shard width, classes, column offset, options
    ("plain", 6, 40, 160, 80, {}),
    ("smoothing_weights_softcap", 6, 40, 160, 40, {"label_smoothing": 0.1, "softcap": 5.0, "weight": True}),
    ("first_shard", 5, 33, 99, 0, {"label_smoothing": 0.2}),
    ("block_loop", 2, 20000, 40000, 20000, {"label_smoothing": 0.1, "weight": True}),
]


@pytest.mark.parametrize("name,rows,width,classes,offset,options", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_kernel_matches_reference(device, name, rows, width, classes, offset, options, dtype):
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(rows, width, generator=gen) * 4).to(dtype).to(device)
    # Targets inside and outside this shard, and one ignored row.
    target = torch.randint(0, classes, (rows,), generator=gen)
    target[0] = offset + width // 2
    target[1] = -100
    opts = dict(options)
    weight = (torch.rand(classes, generator=gen) + 0.1).to(device) if opts.pop("weight", False) else None
    kw = dict(ignore_index=-100, label_smoothing=opts.get("label_smoothing", 0.0), softcap=opts.get("softcap"),
              col_offset=offset, n_classes=classes)
    ours = _kernel(logits, target.to(device), weight, **kw)
    ref = reference.vocab_shard_stats(logits.double(), target.to(device), weight, **kw)
    assert ours.shape == (rows, 4) and ours.dtype == torch.float32
    assert torch.equal(ours[1].cpu(), torch.tensor([0.0, 1.0, 0.0, 0.0]))  # ignored: (0, 1, 0, 0), not read
    # fp32 statistics of the same (rounded) inputs: a few fp32 ulps of the row's scale.
    scale = ref.abs().amax(0).clamp_min(1.0)
    assert ((ours.double().cpu() - ref.cpu()).abs() <= 8 * torch.finfo(torch.float32).eps * scale * width ** 0.5).all()
    assert ours[0, 2] != 0  # the owned target's logit is there


def test_out_of_range_target_poisons_the_row(device):
    logits = torch.randn(3, 16, device=device)
    target = torch.tensor([5, 64, 70], device=device)  # 64 and 70 are outside the 64 classes
    stats = _kernel(logits, target, None, ignore_index=-100, label_smoothing=0.0, softcap=None, col_offset=16,
                    n_classes=64)
    assert torch.isfinite(stats[0]).all()
    assert torch.isnan(stats[1:, 2]).all()


def test_slice_outside_the_classes_is_refused(device):
    with pytest.raises(ValueError, match="not inside the 64 classes"):
        _kernel(torch.randn(2, 16, device=device), torch.zeros(2, dtype=torch.long, device=device), None,
                ignore_index=-100, label_smoothing=0.0, softcap=None, col_offset=56, n_classes=64)


@pytest.mark.slow
def test_compiles_for_every_target_without_spills():
    """Ahead-of-time compile (no GPU needed) for the six targets: the kernel is not in the op registry (it needs a
    process group to be useful), so the static gate does not see it; this test does. Wide rows (the block loop)
    and every option on."""
    import triton.language as tl

    from wavefront.archs import DEFAULT_TARGETS, get_arch
    from wavefront.kernels import vocab_parallel
    from wavefront.kernels.row_config import row_config
    from wavefront.workbench.static.aot import CompileJob, TensorProxy, WorkerPool

    n_cols, n_rows = 64128, 4096  # a 128k vocabulary over 2 ranks
    cfg_flags = dict(HAS_WEIGHT=True, HAS_SOFTCAP=True, HAS_SMOOTHING=True, ACC=tl.float32)
    pool = WorkerPool(1)
    try:
        for target in DEFAULT_TARGETS:
            cfg = row_config(n_cols, torch.bfloat16, get_arch(target), online=True)
            # logits, targets, class weights (all 2 n_cols classes), stats; then the scalars in signature order.
            args = (TensorProxy(torch.bfloat16, 1 << 20, 2 * n_cols * n_rows),
                    TensorProxy(torch.int64, 1 << 21, 8 * n_rows), TensorProxy(torch.float32, 1 << 22, 8 * n_cols),
                    TensorProxy(torch.float32, 1 << 23, 16 * n_rows), n_cols, 2 * n_cols, n_cols, n_cols, 1, -100, 30.0)
            result = pool.compile(CompileJob(
                module=vocab_parallel.__name__, qualname="_vocab_shard_stats_kernel", file=vocab_parallel.__file__,
                args=args, constexprs=tuple((cfg_flags | {"BLOCK_N": cfg.BLOCK_N}).items()),
                options=tuple(cfg.options().items()), target=target))
            assert result.ok, (target, result.error)
            assert result.code.spill_bytes == 0, (target, result.code)
            assert max(result.code.load_widths) == 128, (target, result.code.load_widths)  # 16-byte vector loads
    finally:
        pool.close()
