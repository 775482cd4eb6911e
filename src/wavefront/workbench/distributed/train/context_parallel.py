"""``wavefront train --cp N``: context parallelism through ``wavefront.parallel.ring_attention``.

The ``cp`` ranks of one data-parallel slice read the same sequences and each keeps its zig-zag shard of
them (chunks r and 2 cp - 1 - r of 2 cp: every rank gets one early and one late chunk, so causal work is
balanced). What follows the layout:

- positions: ``position_ids`` are the shard's global positions, so RoPE rotates each token as in the
  unsharded sequence;
- labels: shifted on the whole sequence first (next token, -100 after the last), then sharded, and given to
  the model as ``shift_labels`` (transformers' loss and wavefront's fused loss then take them as they are);
- attention: the model's attention implementation becomes "wavefront-ring", an added entry of transformers'
  ``AttentionInterface`` that calls ring_attention over the cp group (causal over the global positions; the
  K/V shards travel the ring). Its mask function builds no mask: the harness's batches have no padding;
- loss: each rank's loss is its shard's token-loss sum / the tokens of the whole sequences
  (``num_items_in_batch``), so the cp ranks' losses add up to the unsharded loss, and the gradients of the
  replicated parameters are summed over the cp group after the last micro-batch.

Llama-like families only (llama, qwen2, qwen3, mistral without a sliding window): they take
``position_ids`` and call the attention interface.

With the other mesh dimensions (``pp, dp_replicate, dp_shard, cp, tp``, the cp group spans ranks with the same
tp and pp coordinates):

- tensor parallelism: the zig-zag shard of S / cp tokens is what tensor parallelism sees as "the sequence";
  its sequence-parallel norms hold S / (cp tp) contiguous tokens of it (the norms and the MLP are per
  token, so any split is right), the attention's input is all-gathered over tp back to the whole shard, and
  ring attention runs over the cp group on this tp rank's heads (H / tp query heads over H_kv / tp KV heads).
  Validation asks S divisible by 2 cp (two chunks per cp rank) and by cp tp (the shard splits evenly over
  tp). The norms' gradients are summed over tp (tensor_parallel.py), then every gradient over cp;
- pipeline parallelism: every stage holds the shard of its cp rank (pipeline.py);
- FSDP2 shards over the data-parallel dimensions only; the cp sum of the gradients runs after FSDP2's
  reduce-scatter, on each rank's shard (the cp peers of a rank hold the same shard coordinates).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from wavefront.parallel import ring_attention, shard_sequence

IMPLEMENTATION = "wavefront-ring"
FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
_GROUP: list = [None]  # the cp group the registered attention runs over (one run at a time per process)


def _no_mask(*args, **kwargs) -> None:
    return None


def _ring_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                  is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    if dropout:
        raise NotImplementedError(f"{IMPLEMENTATION}: attention dropout ({dropout}) is not supported")
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError(f"{IMPLEMENTATION}: sliding windows and softcaps are not supported")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    out = ring_attention(query, key, value, _GROUP[0], causal=causal, layout="zigzag", scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def install(model: nn.Module, group) -> None:
    """Route `model`'s attention to ring attention over `group` (an added registry entry, this model only)."""
    from transformers import AttentionInterface  # lazy: optional transformers
    from transformers.masking_utils import AttentionMaskInterface  # lazy: optional transformers

    AttentionInterface.register(IMPLEMENTATION, _ring_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)
    _GROUP[0] = group
    model.set_attn_implementation(IMPLEMENTATION)


def shard(ids: torch.Tensor, rank: int, cp: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens, global positions, next-token targets) of this rank's zig-zag shard of `ids` [B, S]; the
    targets are shifted on the whole sequence first (-100 after its last token), then sharded."""
    shifted = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    local, pos, targets = (shard_sequence(t, rank, cp, 1) for t in (ids, positions, shifted))
    return local, pos, targets


def inputs(ids: torch.Tensor, rank: int, cp: int, n_items: torch.Tensor) -> dict:
    """The model's keyword arguments for this rank's zig-zag shard of the micro-batch `ids` [B, S]."""
    if cp == 1:
        return {"input_ids": ids, "labels": ids, "num_items_in_batch": n_items}
    local, pos, targets = shard(ids, rank, cp)
    return {"input_ids": local, "position_ids": pos, "labels": targets, "shift_labels": targets,
            "num_items_in_batch": n_items}


def pipeline_inputs(ids: torch.Tensor, rank: int, cp: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(first stage's tokens, last stage's targets) of a pipeline step: the shard and its shifted targets
    (the stages compute the positions themselves, pipeline.py); `ids` and None (the loss shifts) when cp is 1."""
    if cp == 1:
        return ids, None
    local, _, targets = shard(ids, rank, cp)
    return local, targets


def reduce_grads(model: nn.Module, group) -> None:
    """Sum the gradients over the cp group: each rank's loss holds only its shard's tokens."""
    from torch.distributed.tensor import DTensor  # lazy: torch submodule on use

    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad, group=group)
