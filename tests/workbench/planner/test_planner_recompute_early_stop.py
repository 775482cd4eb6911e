"""Full recomputation under PyTorch's non-reentrant checkpoint stops before a block's last matmul
(Training.recompute_early_stop): measured on a tiny Llama on CPU, priced by the time model, set per stack
profile.

Autograd saves an aten matmul's inputs before the matmul runs, and non-reentrant torch.utils.checkpoint
(PyTorch >= 2.1, `set_checkpoint_early_stop`, on by default) ends the recomputation once the last tensor the
backward needs has been saved: in a Llama block that is the MLP down projection's input, so the down
projection itself is not rerun. Reentrant checkpointing (Megatron-LM's, DeepSpeed's, Transformer Engine's)
reruns the whole forward.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from wavefront.shapes import get_model
from wavefront.workbench.planner import Efficiency, PlanConfig, Training, make_cluster
from wavefront.workbench.planner.kernels import linear_fwd_bwd_s
from wavefront.workbench.planner.model import ModelSpec
from wavefront.workbench.planner.moe import get_moe_model
from wavefront.workbench.planner.stacks import PROFILES
from wavefront.workbench.planner.time import layer_compute_s, tp_comm_per_layer_s

pytest.importorskip("transformers")

MATMULS = ("mm", "addmm", "bmm")


class _CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.overloadpacket.__name__ in MATMULS
        return func(*args, **(kwargs or {}))


def _matmuls(n_layers: int, policy: str) -> tuple[int, int]:
    """(matmuls in the forward, matmuls in the backward) of one step of the tiny Llama under `wavefront train
    --recompute policy` (train/recompute.py: non-reentrant torch.utils.checkpoint per decoder layer)."""
    from wavefront.workbench.distributed.train import recompute
    from wavefront.workbench.distributed.train.presets import build_model

    model = build_model("tiny-llama", seed=0, attn_implementation="eager", num_hidden_layers=n_layers,
                        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, vocab_size=16)
    model.config.use_cache = False
    recompute.apply(model, policy)
    ids = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(0))
    fwd, bwd = _CountMatmuls(), _CountMatmuls()
    with fwd:
        loss = model.train()(input_ids=ids, labels=ids).loss
    with bwd:
        loss.backward()
    return fwd.n, bwd.n


def test_non_reentrant_full_recompute_skips_the_down_projection():
    """Per layer, `--recompute full` reruns every forward matmul but one: the down projection (7 weight
    matmuls and 2 attention matmuls in the eager Llama layer: 8 rerun)."""
    fwd4, none4 = _matmuls(4, "none")
    fwd2, none2 = _matmuls(2, "none")
    per_layer = (fwd4 - fwd2) // 2
    assert per_layer == 9  # q, k, v, o, gate, up, down + QK^T and PV
    _, full4 = _matmuls(4, "full")
    _, full2 = _matmuls(2, "full")
    rerun_per_layer = ((full4 - none4) - (full2 - none2)) // 2
    assert rerun_per_layer == per_layer - 1
    _, every_other4 = _matmuls(4, "every-other")  # layers 0 and 2 checkpointed
    assert every_other4 - none4 == 2 * (per_layer - 1)


MODEL = ModelSpec(get_model("llama3-8b"))
EFF = Efficiency(gemm=0.7, attention=0.5, hbm=0.9)


def _training(**kw) -> Training:
    return Training(global_batch_tokens=64 * 4096, seq_len=4096, **kw)


def _down_fwd_s(cluster, training: Training, tp: int = 1) -> float:
    """The time model's forward of the down projection (d_ffn/tp -> d_model) for one 4096-token micro-batch."""
    peak = cluster.gpu.peak_tflops(training.precision) * 1e12 * EFF.gemm
    hbm = cluster.gpu.hbm_tbps * 1e12 * EFF.hbm
    d = MODEL.dims
    return linear_fwd_bwd_s(cluster.gpu, 4096, d.ffn_hidden // tp, d.hidden, peak, hbm, 2.0, EFF.kernel_us * 1e-6)[0]


def test_time_model_reruns_the_forward_less_the_last_matmul():
    cluster = make_cluster("8xh100")

    def layer(rc: str, **kw) -> float:
        return layer_compute_s(MODEL, PlanConfig(dp=8, recompute=rc), _training(**kw), cluster, EFF)[0]

    plain = layer("full") - layer("none")  # one whole forward
    early = layer("full", recompute_early_stop=True) - layer("none", recompute_early_stop=True)
    assert early == pytest.approx(plain - _down_fwd_s(cluster, _training()))
    assert 0.2 < (plain - early) / plain < 0.35  # the down projection: 27% of Llama 3 8B's matmul FLOPs
    every_other = layer("every-other", recompute_early_stop=True) - layer("none", recompute_early_stop=True)
    assert every_other == pytest.approx(0.5 * early)
    # fp8 linears are autograd Functions that save their inputs after the GEMM: the whole forward reruns
    fp8 = {es: layer("full", precision="fp8", recompute_early_stop=es) - layer("none", precision="fp8")
           for es in (False, True)}
    assert fp8[True] == pytest.approx(fp8[False])


def test_early_stop_leaves_moe_layers_and_tp_collectives_as_stated():
    cluster = make_cluster("8xh100", intra_gbps=300, intra_latency_us=0)
    t = {es: _training(tp_overlap=0.0, recompute_early_stop=es) for es in (False, True)}
    none = tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, dp=1), t[True], cluster)
    # the MLP's reduction after the down projection is not rerun: 1 of the 2 all-reduces (no SP) ...
    assert tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, dp=1, recompute="full"), t[True], cluster) == \
        pytest.approx(none * 5 / 4)
    # ... and with SP the all-gather, reduce-scatter and all-gather before it are: 1.5 of the 2 pairs
    sp_none = tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, sp=True, dp=1), t[True], cluster)
    assert tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, sp=True, dp=1, recompute="full"), t[True], cluster) == \
        pytest.approx(sp_none * 5.5 / 4)
    assert tp_comm_per_layer_s(MODEL, PlanConfig(tp=8, dp=1, recompute="full"), t[False], cluster) == \
        pytest.approx(none * 6 / 4)
    # a MoE block ends with the weighted combine, which saves the expert outputs: the whole forward reruns
    moe = get_moe_model("mixtral-8x7b")
    spec = ModelSpec(moe.dims, moe=moe.moe)

    def moe_layer(rc: str, es: bool) -> float:
        return layer_compute_s(spec, PlanConfig(dp=8, ep=8, recompute=rc), _training(recompute_early_stop=es),
                               cluster, EFF, moe_layer=True)[0]

    assert moe_layer("full", True) == pytest.approx(moe_layer("full", False))


def test_profiles_state_which_stacks_checkpoint_without_reentrancy():
    """PyTorch-native stacks checkpoint with non-reentrant torch.utils.checkpoint (torchtitan's
    ptd_checkpoint_wrapper, Composer's wrapper with activation_checkpointing_reentrant: false in
    llm-foundry's configs, `wavefront train`); Megatron-Core's and DeepSpeed's checkpointing is reentrant."""
    early = {key for key, p in PROFILES.items() if p.recompute_early_stop}
    assert {k.split("/")[0] for k in early} == {"wavefront-train", "torchtitan", "llm-foundry"}
    for key in early:
        assert PROFILES[key].training_fields()["recompute_early_stop"] is True
        assert any(term.endswith("checkpointing") for term, _ in PROFILES[key].facts), key
