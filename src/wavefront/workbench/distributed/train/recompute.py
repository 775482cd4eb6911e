"""Activation recomputation policies of ``wavefront train --recompute``, the ones the planner prices.

- ``none``: every decoder layer keeps what autograd saves.
- ``full``: each decoder layer runs under ``torch.utils.checkpoint`` (non-reentrant) and keeps only its
  input; backward re-runs its forward (the old ``--activation-checkpointing``).
- ``op``: per-op selective checkpointing, as torchtitan's "op" SAC and Megatron's selective modules do it:
  each layer runs under ``checkpoint`` with a ``create_selective_checkpoint_contexts`` policy that
  saves the outputs of the matmuls (``mm``/``addmm``/``bmm``, wavefront's linear ops), of the attention
  kernels (SDPA flash/efficient/cuDNN, wavefront's attention forward: output and log-sum-exp) and of
  tensor-parallel reduce-scatters, and recomputes everything else (norms, RoPE, the gated activation,
  residual adds, copies) in backward. Unlike torchtitan's policy it saves every matmul, not every other
  one: what ``planner.model.layer_activation_bytes(recompute="op")`` counts.
- ``every-other``: ``full`` on layers 0, 2, 4, ... and nothing on the others (torchtitan's full AC with
  a frequency of 2); the planner keeps the mean of ``none`` and ``full`` per layer.

The planner's ``selective`` (Korthikanti: recompute the materialised attention core) frees nothing under
flash or SDPA attention (the core keeps only its log-sum-exp), so a plan asking for it runs as ``none``.

Hooked through Hugging Face's per-layer switch (``GradientCheckpointingLayer.gradient_checkpointing`` and
``_gradient_checkpointing_func``), which checkpoints ``forward`` and leaves module hooks (FSDP2's) outside
the recomputed region; the layers stay the same module objects, so FSDP2, TP and pipeline cutting see them.
The loss is the same under every policy (recomputation changes what is stored, not what is computed;
tests/workbench/planner/test_planner_recompute_measured.py checks losses and gradients).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from wavefront.workbench.distributed.train.kpi import flops_per_token as kpi_flops

#: --recompute choices (the planner's RECOMPUTE_MODES minus "selective"; module docstring).
POLICIES = ("none", "full", "op", "every-other")

#: Operator names (``OpOverloadPacket`` qualified names) whose outputs the "op" policy saves.
SAVED_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "wavefront::linear_fwd", "wavefront::linear_fp8_fwd", "wavefront::grouped_linear_fwd",
    "wavefront::attention_fwd", "_c10d_functional::reduce_scatter_tensor",
})


def from_plan(recompute: str) -> str:
    """The policy that runs a planner plan's ``recompute`` field (selective: none, module docstring)."""
    return "none" if recompute == "selective" else recompute


def _op_policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    name = getattr(func, "_schema", None)
    saved = name is not None and name.name in SAVED_OPS
    return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE


def _op_contexts():
    return create_selective_checkpoint_contexts(_op_policy)


def checkpointing_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers Hugging Face can checkpoint one by one, in model order."""
    from transformers.modeling_layers import GradientCheckpointingLayer  # lazy: optional transformers

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply(model: torch.nn.Module, policy: str) -> int:
    """Set `policy` on `model`'s decoder layers; returns how many layers recompute."""
    if policy not in POLICIES:
        raise ValueError(f"recompute must be one of {', '.join(POLICIES)}, got {policy!r}")
    layers = checkpointing_layers(model)
    if policy != "none" and not layers:
        raise ValueError(f"--recompute {policy}: {type(model).__name__} has no Hugging Face checkpointable layers")
    kwargs: dict = {"use_reentrant": False}
    if policy == "op":
        kwargs["context_fn"] = _op_contexts
    fn = functools.partial(checkpoint, **kwargs)
    n = 0
    for i, layer in enumerate(layers):
        on = policy in ("full", "op") or (policy == "every-other" and i % 2 == 0)
        layer._gradient_checkpointing_func = fn
        layer.gradient_checkpointing = on
        n += on
    return n


def flops_per_token(config, seq_len: int, n_matmul_params: int, policy: str) -> tuple[float, float]:
    """(model, hardware) FLOPs per token under `policy`: "op" recomputes no matmul (hardware = model),
    "every-other" half of "full"'s extra forward."""
    if policy in ("none", "op"):
        return kpi_flops(config, seq_len, n_matmul_params, "none")
    model_f, full_f = kpi_flops(config, seq_len, n_matmul_params, "full")
    return model_f, full_f if policy == "full" else 0.5 * (model_f + full_f)
