"""Patched and unpatched models train the same: loss at every step, final parameters, eval logits.

The tolerance is derived per run from the unpatched fp32 runs' spread around a float64 run (see
wavefront.workbench.distributed.train.convergence); 20 AdamW steps on the fixed synthetic corpus. The default
suite trains one-layer models on 4-token sequences (every family-specific module is in a layer, so one
suffices, and every patched kernel still runs each step; under the Triton interpreter the cost is per row,
so 4 tokens cost half of 8); the slow variant trains the two-layer presets for 30 steps on a larger batch
of 8-token sequences.
"""

from __future__ import annotations

import pytest

from wavefront.workbench.distributed.train.convergence import run_convergence
from wavefront.workbench.distributed.train.presets import TINY_BY_FAMILY

# Everything the default patch swaps: norms, RoPE, the gated MLP and the fused LM-head loss.
FULL_PATCH = {"rope": True, "mlp": True, "loss": True}


def _check(result, steps: int, refused: set[str]) -> None:
    counts = result.patch_report["counts"]
    assert result.patch_report["ok"] and counts["rms_norm"] >= 3
    assert all(counts.get(op, 0) >= 1 for op in set(FULL_PATCH) - refused), counts
    assert not set(counts) & refused, counts
    assert len(result.loss_patched) == steps
    assert min(result.loss_ref) < result.loss_ref[0], "the corpus must be learnable"
    bad = [f"{c.what}: |patched-ref|={c.err_patched:.3g} > tol={c.tol:.3g} (fp32 envelope {c.err_eager:.3g})"
           for c in result.failures()]
    assert not bad, "\n".join(bad)
    assert len(result.checks) == steps + 2


def _options(refused: set[str]) -> dict:
    """FULL_PATCH less the ops the family's rules refuse (GLM-4's RoPE, Granite's loss: see docs/patching.md)."""
    return {**FULL_PATCH, **dict.fromkeys(refused, False)}


def test_patched_training_agrees_with_unpatched(family, single_thread, uncovered):
    refused = uncovered(family) - {"attention"}
    result = run_convergence(TINY_BY_FAMILY[family], steps=20, seq_len=4, patch_options=_options(refused),
                             num_hidden_layers=1)
    _check(result, 20, refused)


#: Known: the two-layer tiny Qwen2.5-VL run turns unstable at step 16 (lr 1e-2); from there a norms-only or an
#: MLP-only patch (each op within the accuracy rule on its own) grows past the envelope of weight-nudged fp32
#: runs. The one-layer proof above passes. Strict: a change that makes it pass shows.
KNOWN_DIVERGENT = {"qwen2_5_vl": "2-layer tiny Qwen2.5-VL is unstable from step 16: ulp-level differences in the "
                                 "norms or the MLP alone leave the weight-nudge envelope"}


@pytest.mark.slow
def test_patched_training_agrees_two_layers_longer(family, single_thread, uncovered, request):
    if family in KNOWN_DIVERGENT:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN_DIVERGENT[family]))
    refused = uncovered(family) - {"attention"}
    _check(run_convergence(TINY_BY_FAMILY[family], steps=30, batch=2, patch_options=_options(refused)), 30, refused)
