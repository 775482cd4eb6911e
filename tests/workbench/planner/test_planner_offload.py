"""Activation offloading to host memory (Training.offload_activation_layers, Megatron-Core's CPU offloading):
what it takes off the GPU, what its copies cost, where it is refused, and the GB200 plans that need it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from wavefront.workbench.planner import PlanConfig, Training, make_cluster, plan
from wavefront.workbench.planner.job import parse_fixed
from wavefront.workbench.planner.memory import device_capacity, memory_breakdown, offload_fraction
from wavefront.workbench.planner.model import layer_activation_bytes
from wavefront.workbench.planner.search import _as_model, evaluate
from wavefront.workbench.planner.time import (
    HOST_LINK_GBPS,
    PCIE_GBPS,
    activation_offload_exposed_s,
    output_layer_s,
    step_time,
)
from wavefront.workbench.planner.training import Efficiency
from wavefront.workbench.planner.validation import load_table, predict_row

DATA = Path(__file__).parents[2] / "data" / "published" / "validation"
SEQ = 8192


def _fsdp70b(gpu: str, offload: int, mb: int = 2) -> tuple:
    spec, cluster = _as_model("llama3-70b"), make_cluster(f"64x{gpu}", gpus_per_node=64 if gpu == "gb200" else 8)
    cfg = PlanConfig(dp=64, zero=3, micro_batch=mb)
    t = Training(global_batch_tokens=256 * SEQ, seq_len=SEQ, precision="fp8", offload_activation_layers=offload)
    return spec, cfg, t, cluster


def test_offloaded_layers_leave_the_gpu_but_one_in_transfer():
    """k of n layers offloaded: (k - 1)/n of the layer activations are in host memory (one offloaded layer
    is always on its way), the rest of the memory is untouched."""
    spec, cfg, t, cluster = _fsdp70b("gb200", 40)
    base = memory_breakdown(spec, cfg, replace(t, offload_activation_layers=0), cluster)
    off = memory_breakdown(spec, cfg, t, cluster)
    assert offload_fraction(spec, t) == pytest.approx(39 / 80)
    per_layer = layer_activation_bytes(spec, seq_len=SEQ, micro_batch=2, tp=1, sp=False, recompute="none",
                                       kv_len=SEQ, fp8=True)
    assert off.offloaded_bytes == pytest.approx(39 * per_layer)
    assert base.activations_bytes - off.activations_bytes == pytest.approx(off.offloaded_bytes)
    assert (off.params_bytes, off.optimizer_bytes, off.transient_bytes) == (
        base.params_bytes, base.optimizer_bytes, base.transient_bytes)
    assert memory_breakdown(spec, cfg, replace(t, offload_activation_layers=1), cluster).offloaded_bytes == 0.0


def test_megatron_bridge_gb200_fsdp_plan_fits_only_with_its_recipes_offloading():
    """Llama 3 70B, Megatron FSDP over 64 GB200, micro-batch 2, no recomputation (Megatron-Bridge 25.11-26.04):
    342.6 GB of which 299 GB activations without offloading; with the 40 layers the GB200 FP8-CS config
    offloads, within the GB200's 189,471 MiB."""
    doc = load_table(DATA / "megatron_bridge_gb200.json")
    row = next(r for r in doc["rows"] if r["id"] == "26.04 gb200 llama3-70b 64gpu fsdp64 tp1 pp1 cp1 vp1 mb2")
    assert row["offload_activation_layers"] == 40
    capacity, source = device_capacity(make_cluster("8xgb200").gpu)
    assert capacity == 189_471 * 2**20 and "nvidia-smi" in source
    without = predict_row(doc, row | {"offload_activation_layers": 0})
    with_ = predict_row(doc, row)
    assert without.memory.total_bytes > 1.7 * capacity
    assert with_.memory.fits_device and not without.memory.fits_device
    # NVLink-C2C hides the copies under this plan's compute: the step time does not move
    assert with_.time.offload_s == 0.0 and with_.time.step_s == without.time.step_s


def test_copies_the_host_link_cannot_hide_are_exposed():
    """The same plan on 64 B200 (PCIe host link, 25 GB/s each way) exposes what exceeds the offloaded layers'
    forward (one third of their seconds) and backward (two thirds); over C2C (450 GB/s) nothing."""
    spec, cfg, t, cluster = _fsdp70b("b200", 40)
    eff = Efficiency.for_gpu("b200")
    plain = step_time(spec, cfg, replace(t, offload_activation_layers=0), cluster, eff)
    assert plain.n_micro == 2
    layers_s = plain.compute_s / 2 - output_layer_s(spec, cfg, t, cluster, eff)  # the 80 layers, one micro-batch
    per_layer = layer_activation_bytes(spec, seq_len=SEQ, micro_batch=2, tp=1, sp=False, recompute="none",
                                       kv_len=SEQ, fp8=True)
    copy = 40 * per_layer / (PCIE_GBPS * 1e9)
    under = 40 / 80 * layers_s
    want = max(0.0, copy - under / 3) + max(0.0, copy - 2 * under / 3)
    assert want > 0
    assert activation_offload_exposed_s(spec, cfg, t, cluster, layers_s) == pytest.approx(want)
    timed = step_time(spec, cfg, t, cluster, eff)
    assert timed.offload_s == pytest.approx(2 * want) and sum(timed.parts().values()) == pytest.approx(timed.step_s)
    assert HOST_LINK_GBPS["gb200"] == 450.0
    gb = _fsdp70b("gb200", 40)
    assert activation_offload_exposed_s(*gb, layers_s) == 0.0


def test_offloading_is_refused_with_a_pipeline_and_at_every_layer():
    spec, _, t, cluster = _fsdp70b("gb200", 40)
    piped = evaluate(spec, PlanConfig(dp=16, pp=4, zero=1, micro_batch=1), t, cluster)
    assert piped.memory is None and any("pipeline parallel 1" in r for r in piped.reasons)
    every = evaluate(spec, PlanConfig(dp=64, zero=3, micro_batch=2), replace(t, offload_activation_layers=80),
                     cluster)
    assert any("below the 80 layers" in r for r in every.reasons)
    with pytest.raises(ValueError, match="offload_activation_layers must be >= 0"):
        replace(t, offload_activation_layers=-1)


def test_fix_pins_offloading_and_the_search_keeps_to_pp1():
    assert parse_fixed(["offload_activation_layers=40"]) == {"offload_activation_layers": 40}
    with pytest.raises(ValueError, match="--fix offload_activation_layers must be >= 0"):
        parse_fixed(["offload_activation_layers=-2"])
    spec, _, t, cluster = _fsdp70b("gb200", 0)
    res = plan(spec, cluster, replace(t, micro_batch_sizes=(2,)), fixed={"offload_activation_layers": 40, "zero": 3})
    assert res.ranked and all(r.config.pp == 1 for r in res.ranked)
    assert all(r.memory.offloaded_bytes > 0 for r in res.ranked if r.config.recompute == "none")
