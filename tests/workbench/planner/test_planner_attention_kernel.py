"""The attention-kernel class (Training.attention_kernel): Transformer Engine's cuDNN attention and
FlashAttention-3 priced with the FlashAttention-3 paper's ratios over FlashAttention-2, on Hopper only."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.shapes import get_model
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner import Efficiency, PlanConfig, PlanRequest, Training, make_cluster, plan
from wavefront.workbench.planner.kernels import ATTENTION_KERNEL_SPEEDUP
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.time import layer_compute_s
from wavefront.workbench.planner.validation import REPORT_TABLES, load_table

DATA = Path(__file__).resolve().parents[2] / "data" / "published"


def _fwd_bwd_speedup(fa2_fwd: float, fa2_bwd: float, fwd: float, bwd: float) -> float:
    """Forward + backward time ratio; the backward does 2.5x the forward's FLOPs."""
    return (1 / fa2_fwd + 2.5 / fa2_bwd) / (1 / fwd + 2.5 / bwd)


def test_ratios_are_the_flashattention3_papers_figures():
    """FlashAttention-3 paper (arXiv:2407.08608), H100 SXM5 bf16 d128 at 8K tokens: causal forward FA2 333,
    cuDNN 529, FA3 602 TFLOP/s (Fig. 5); backward FA2 318, cuDNN 518, FA3 559 (Fig. 6)."""
    assert ATTENTION_KERNEL_SPEEDUP["fa2"] == 1.0
    assert ATTENTION_KERNEL_SPEEDUP["cudnn"] == pytest.approx(_fwd_bwd_speedup(333, 318, 529, 518), abs=0.005)
    assert ATTENTION_KERNEL_SPEEDUP["fa3"] == pytest.approx(_fwd_bwd_speedup(333, 318, 602, 559), abs=0.005)


def _layer(gpu: str, kernel: str, eff: Efficiency | None = None) -> tuple[float, float]:
    model = ModelSpec(get_model("llama3-8b"))
    cluster = make_cluster((8, get_gpu(gpu)))
    training = Training(global_batch_tokens=64 * 8192, seq_len=8192, attention_kernel=kernel)
    return layer_compute_s(model, PlanConfig(dp=8), training, cluster, eff or Efficiency.for_gpu(gpu))


def test_cudnn_and_fa3_speed_up_only_the_attention_core_on_hopper_and_cudnn_on_blackwell():
    """Every kernel class on Hopper; cuDNN on Blackwell too (kernels.py: cuDNN reaches about the same
    fraction of the bf16 peak on B200 as on H100); FA3 is Hopper-only; nothing on Ampere or AMD."""
    for gpu, kernels in (("h100", ("cudnn", "fa3")), ("b200", ("cudnn",)), ("gb200", ("cudnn",))):
        total_fa2, attn_fa2 = _layer(gpu, "fa2")
        for kernel in kernels:
            total, attn = _layer(gpu, kernel)
            speed = ATTENTION_KERNEL_SPEEDUP[kernel]
            # the attention core (minus its fixed per-kernel cost) runs `speed` times faster; nothing else moves
            kernel_s = Efficiency.for_gpu(gpu).kernel_us * 1e-6
            assert (attn - kernel_s) == pytest.approx((attn_fa2 - kernel_s) / speed, rel=1e-9)
            assert total_fa2 - total == pytest.approx(3.5 * (attn_fa2 - attn), rel=1e-6)
    assert _layer("b200", "fa3") == _layer("b200", "fa2")
    for gpu in ("a100", "mi300x"):
        assert _layer(gpu, "cudnn") == _layer(gpu, "fa2")


def test_a_measured_or_given_attention_efficiency_is_taken_as_is():
    """--attn-eff and --calibrate give what the run's own kernel reaches: no class factor on top."""
    eff = replace(Efficiency.for_gpu("h100"), attention=0.3, attention_as_is=True)
    assert _layer("h100", "cudnn", eff) == _layer("h100", "fa2", eff)
    request = PlanRequest(model="llama3-8b", gpus=("8xh100",), attn_eff=0.3, attention_kernel="cudnn")
    assert request.efficiency(make_cluster((8, get_gpu("h100")))).attention_as_is


def test_plan_takes_the_kernel_and_rejects_an_unknown_one():
    base = plan(PlanRequest(model="llama3-8b", gpus=("8xh100",), seq_len=8192, fixed={"tp": 1, "pp": 1, "cp": 1}))
    fast = plan(PlanRequest(model="llama3-8b", gpus=("8xh100",), seq_len=8192, fixed={"tp": 1, "pp": 1, "cp": 1},
                            attention_kernel="cudnn"))
    assert fast.best.time.step_s < base.best.time.step_s
    with pytest.raises(ValueError, match="attention_kernel must be one of"):
        Training(global_batch_tokens=8192, seq_len=8192, attention_kernel="fa4")
    cli = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-8b", "--attention-kernel", "fa4"])
    assert cli.exit_code == 2 and "Traceback" not in cli.output and "attention-kernel" in cli.output


def test_transformer_engine_tables_declare_cudnn_and_the_others_keep_the_default():
    """The rule the validation tables follow: Transformer Engine stacks (NeMo, Megatron-Bridge) run cuDNN
    attention on Hopper from mid-2024 (NeMo 24.07 on); NeMo 24.03.01's Transformer Engine still ranked
    flash-attn first, so that table states FlashAttention-2 and says why; llm-foundry (flash-attn 2),
    Narayanan 2021 and Llama 3 keep FlashAttention-2."""
    kernels = {}
    for rel in REPORT_TABLES:
        doc = load_table(DATA / rel)
        kernels[doc["name"]] = doc["defaults"].get("attention_kernel", "fa2")
        if kernels[doc["name"]] == "cudnn":
            assert "Transformer Engine" in doc["assumed"]["attention_kernel"]
    te = {n for n in kernels if n.startswith(("nemo_", "megatron_bridge_", "dgxc_nemo_"))
          and n != "nemo_2403_long_sequence"}
    assert te and all(kernels[n] == "cudnn" for n in te)
    early = load_table(DATA / "validation" / "nemo_2403_long_sequence.json")
    assert kernels[early["name"]] == "fa2" and "NVIDIA/NeMo#9188" in early["assumed"]["attention_kernel"]
    assert all(k == "fa2" for n, k in kernels.items() if n not in te)
    assert json.loads((DATA / "validation" / "llmfoundry_mpt.json").read_text())["defaults"].get(
        "attention_kernel", "fa2") == "fa2"
