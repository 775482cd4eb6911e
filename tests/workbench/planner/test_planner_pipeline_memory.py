"""Pipeline memory as the schedule holds it: uneven chunks (Llama 3 405B's 126 layers on 16 x 8), the
in-flight micro-batches stepped from the schedule's own order, per-rank peaks, and the published plans
that ran checked against the device they ran on."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np  # only to draw random chunk weights
import pytest

from wavefront.workbench.planner.pipeline import _order, candidate_ranks, chunk_layers, live_counts, peak
from wavefront.workbench.planner.validation import load_table, predict_row

PUBLISHED = Path(__file__).parents[2] / "data" / "published"


def _stepped(pp: int, vpp: int, m: int, rank: int) -> list[tuple[int, ...]]:
    """The live sets by stepping through the schedule's order one operation at a time."""
    live, rows = [0] * vpp, set()
    for forward, _, chunk in _order(pp, vpp, m, rank):
        live[chunk] += 1 if forward else -1
        assert live[chunk] >= 0
        if forward:
            rows.add(tuple(live))
    assert not any(live)  # every forward has its backward
    return sorted(rows)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 1, 8), (4, 1, 2), (4, 2, 8), (4, 2, 32), (16, 8, 16), (16, 8, 32),
                                              (8, 5, 16), (2, 40, 4)])
def test_closed_form_live_sets_match_stepping_the_schedule(pp, vpp, m):
    rng = np.random.default_rng(pp * 100 + vpp * 10 + m)
    for rank in range(pp):
        w = list(rng.random(vpp))
        assert peak(live_counts(pp, vpp, m, rank), w)[0] == pytest.approx(peak(_stepped(pp, vpp, m, rank), w)[0])


def test_in_flight_counts_from_the_schedule():
    # 1F1B: rank r holds min(pp - r, m) micro-batches (Narayanan et al. 2021)
    assert [peak(live_counts(4, 1, 8, r), [1.0])[0] for r in range(4)] == [4, 3, 2, 1]
    assert peak(live_counts(4, 1, 2, 0), [1.0])[0] == 2
    # interleaved: 2 (pp-1) + (vpp-1) pp warm-up chunks + 1, capped at m vpp (every forward before a backward)
    assert peak(live_counts(4, 2, 32, 0), [1.0] * 2)[0] == 11
    assert peak(live_counts(16, 8, 16, 0), [1.0] * 8)[0] == 128
    assert peak(live_counts(16, 8, 16, 15), [1.0] * 8)[0] == 113


def test_uneven_chunks_lose_layers_at_the_ends():
    layers = chunk_layers(126, 16, 8)  # Llama 3 405B: first chunk embedding only, last chunk output only
    assert layers[0] == [0, 1, 1, 1, 1, 1, 1, 1] and layers[15] == [1, 1, 1, 1, 1, 1, 1, 0]
    assert all(row == [1] * 8 for row in layers[1:15]) and sum(map(sum, layers)) == 126
    assert chunk_layers(126, 16, 1)[0] == [7] and chunk_layers(126, 16, 1)[15] == [7]
    assert chunk_layers(80, 4, 5) == [[4] * 5] * 4
    assert candidate_ranks(layers) == [0, 1, 15]


def test_llama3_405b_peak_is_the_second_rank_with_every_micro_batch_in_flight():
    """Meta's plan at 16K H100 (16 micro-batches per pipeline): under Megatron-LM's interleaved schedule
    every forward runs before the first backward on ranks 0-8, so rank 1 (8 one-layer chunks, no
    embedding) holds 16 x 8 layers; rank 0 holds 16 x 7. The old model put 16 x 8 x (1 + 15/128) on
    rank 0: 89.4 GB, 76.2 GB of activations."""
    doc = load_table(PUBLISHED / "llama3_2024_table4.json")
    res = predict_row(doc, next(r for r in doc["rows"] if r["id"] == "8K-16384"))
    mem = res.memory
    per_layer = (mem.activations_bytes) / 128
    assert mem.stage == "rank 1" and mem.inflight_micro_batches == 16
    assert 0.50e9 < per_layer < 0.56e9  # 405B, tp8 + sp, 8K, micro-batch 1: ~32 sbh/t bytes per layer
    assert mem.total_bytes < 81e9  # was 89.4 GB


# Published runs the memory model still puts over their device, with the total it gives them (GB, rounded
# up). The list may only shrink: a row that starts to fit must come off it, a row on it may not grow. Before
# the schedule-derived in-flight counts it had 35 rows (Megatron-Bridge's 405B on B200 at tp4 pp8 vp8 cp2
# fits now) and 405B 8K-16384 was at 89.4 GB.
KNOWN_OVER = {
    ('korthikanti2022', 'T4 22B baseline'): 118.8,
    ('korthikanti2022', 'T4 22B sequence parallel'): 96.5,
    ('korthikanti2022', 'T4 22B selective'): 85.7,
    ('llama3_2024_table4', '8K-8192'): 88.2,
    ('llama3_2024_table4', '8K-16384'): 80.5,
    ('llama3_2024_table4', '128K-16384'): 80.5,
    ('narayanan2021_table2', 'ZeRO-3 530B 640'): 114.5,
    ('narayanan2021_table2', 'ZeRO-3 530B 1120'): 80.3,
    ('torchtitan_llama3_h100_202412', 'T1 8B FSDP8 lbs2'): 88.7,
    ('automodel_moe', 'h100 deepseek-v3 1024gpu tp1 pp4 cp1 vp8 ep64 mb1'): 171.1,
    ('automodel_moe', 'h100 deepseek-v3 256gpu tp1 pp4 cp1 vp8 ep64 mb1'): 203.6,
    ('automodel_moe', 'h100 qwen3-30b-a3b 8gpu tp1 pp1 cp1 vp1 ep8 mb4'): 190.2,
    ('llmfoundry_mpt', 'H100 bf16 3b s8192 n8 mb3 ga6'): 81.6,
    ('llmfoundry_mpt', 'H100 bf16 1b s2048 n32 mb20 ga1'): 80.3,
    ('llmfoundry_mpt', 'H100 bf16 1b s2048 n16 mb20 ga1'): 81.0,
    ('llmfoundry_mpt', 'A100-80GB bf16 3b s8192 n8 mb3 ga6'): 81.6,
    ('llmfoundry_mpt', 'A100-40GB bf16 3b s2048 n32 mb6 ga1'): 40.6,
    ('llmfoundry_mpt', 'A100-40GB bf16 1b s2048 n128 mb10 ga1'): 41.2,
    ('llmfoundry_mpt', 'A100-40GB bf16 1b s2048 n64 mb10 ga1'): 41.4,
    ('llmfoundry_mpt', 'A100-40GB bf16 1b s2048 n32 mb10 ga1'): 41.6,
    ('llmfoundry_mpt', 'A100-40GB bf16 350m s2048 n128 mb18 ga1'): 40.9,
    ('llmfoundry_mpt', 'A100-40GB bf16 350m s2048 n64 mb18 ga1'): 40.9,
    ('llmfoundry_mpt', 'A100-40GB bf16 350m s2048 n32 mb18 ga1'): 41.0,
    ('llmfoundry_mpt', 'A100-40GB bf16 350m s2048 n16 mb18 ga1'): 41.1,
    ('megatron_bridge_2509_moe', 'b200 deepseek-v3 256gpu tp1 pp16 cp1 vp1 ep8 mb1'): 187.9,
    ('megatron_bridge_2509_moe', 'b200 qwen3-235b-a22b 64gpu tp1 pp8 cp1 vp2 ep8 mb1'): 188.5,
    ('megatron_bridge_2509_moe', 'h100 deepseek-v3 1024gpu tp2 pp8 cp1 vp4 ep64 mb1'): 89.6,
    ('megatron_bridge_2509_moe', 'h100 qwen3-30b-a3b 16gpu tp1 pp2 cp1 vp24 ep8 mb2'): 89.1,
    ('megatron_bridge_2511_moe', 'b200 deepseek-v3 256gpu tp1 pp16 cp1 vp1 ep8 mb1'): 187.9,
    ('megatron_bridge_2511_moe', 'b200 qwen3-235b-a22b 64gpu tp1 pp8 cp1 vp2 ep8 mb1'): 188.5,
    ('megatron_bridge_2511_moe', 'h100 qwen3-30b-a3b 16gpu tp1 pp2 cp1 vp24 ep8 mb2'): 89.1,
    ('nemo_2407_h100_fp8', 'nemo-gpt3-20b 64gpu tp2 pp1 cp1 vp1 mb2 gbs256'): 81.7,
    ('nemo_2407_h100_fp8', 'nemotron4-340b 128gpu tp8 pp8 cp1 vp12 mb1 gbs32'): 93.2,
    ('nemo_2407_h100_fp8', 'llama3-8b 8gpu tp1 pp1 cp2 vp1 mb1 gbs128'): 80.1,
}


def _over_device() -> dict:
    out = {}
    for path in sorted(glob.glob(str(PUBLISHED / "*.json")) + glob.glob(str(PUBLISHED / "validation" / "*.json"))):
        doc = load_table(path)
        for row in doc["rows"]:
            res = predict_row(doc, row)
            if res.memory is not None and not res.memory.fits_device:
                out[(doc["name"], str(row.get("id")))] = res.memory.total_bytes / 1e9
    return out


def test_published_plans_fit_on_the_devices_they_ran_on():
    """Every row of every published table that records a parallel layout (296 rows): fits the device it
    ran on, or is on KNOWN_OVER (34 rows, among them Llama 3 405B: not yet done)."""
    over = _over_device()
    for key, gb in over.items():
        assert key in KNOWN_OVER, f"{key} now over its device at {gb:.1f} GB"
        assert gb <= KNOWN_OVER[key] + 0.05, f"{key} grew to {gb:.1f} GB"
    assert not set(KNOWN_OVER) - set(over), f"rows that now fit: {set(KNOWN_OVER) - set(over)}"
