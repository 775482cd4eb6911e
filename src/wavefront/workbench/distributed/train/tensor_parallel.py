"""Tensor and sequence parallelism for the Llama-like families (Llama, Mistral, Qwen2, Qwen3) with DTensor's
``parallelize_module``, wavefront's kernels running on the local shards.

The plan per decoder layer (Megatron-LM with sequence parallelism, Korthikanti et al. 2022; torchtitan's
Llama plan), with ``S`` the sequence and ``T`` the tensor-parallel degree:

- ``embed_tokens``: row-wise (vocabulary-sharded table), output sharded on the sequence (reduce-scatter);
- ``input_layernorm``, ``post_attention_layernorm``, ``norm``: sequence parallel, each rank normalizes its
  S/T tokens with the (wavefront or Hugging Face) norm on a plain local tensor;
- ``self_attn`` / ``mlp``: the input is all-gathered over the sequence once; ``q/k/v/gate/up_proj`` are
  column-wise with local outputs, so RoPE, attention (H/T query heads over KV/T KV heads: GQA keeps its
  group size) and SwiGLU run on plain local tensors; ``o_proj``/``down_proj`` are row-wise with the output
  reduce-scattered back onto the sequence;
- ``lm_head``: vocabulary-parallel (Megatron's parallel output layer): its weight is sharded by vocabulary
  rows (a DTensor ``Shard(0)``, V/T rows per rank) and the loss is computed from this rank's rows only, with
  Megatron's cross-entropy statistics (local max and sum of exponentials, all-reduced): no rank ever holds the
  whole [tokens x V] logits. Patched, :class:`~wavefront.patching.loss.FusedLossHead` runs
  ``vocab_parallel_linear_cross_entropy`` on the local weight shard (chunked: not even the shard's logits
  exist whole); unpatched, the Linear is ``ColwiseParallel`` with local [tokens x V/T] logits and
  ``vocab_parallel_cross_entropy`` (patching/loss.py ``vocab_parallel_head``). The final norm's output is
  all-gathered over the sequence first (every rank scores every token against its classes, as Megatron's
  output layer and torchtitan's ``loss_parallel`` do); the loss all-reduces the hidden states' gradient (each
  rank's part covers its classes) and each rank keeps its sequence slice of it. A tied head
  (``tie_word_embeddings``) shares the embedding's table, already sharded by the same vocabulary rows.
  Pipeline stages (pipeline.py) keep a replicated head: their loss function receives whole logits.

The norm weights stay plain tensors, the same on every tensor-parallel rank (same seed); each rank's
gradient covers only its tokens (sequence-parallel norms) or its heads (Qwen3's q/k norms), so
:func:`reduce_partial_grads` sums them over the tensor-parallel group after backward (Megatron's
all-reduce of sequence-parallel parameters' gradients).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from wavefront.patching.loss import vocab_parallel_head

#: The families whose layout this plan covers (patching/rules/llama_like.py).
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


class SequenceParallelNorm:
    """A norm applied to this rank's sequence shard: DTensor Shard(1) (or its local tensor) in, plain local
    norm, DTensor Shard(1) out; ``gather_output`` returns the whole sequence as a plain local tensor."""

    def __init__(self, *, gather_output: bool = False):
        self.gather_output = gather_output

    def _apply(self, module: nn.Module, mesh) -> nn.Module:
        from torch.distributed.tensor import DTensor, Replicate, Shard  # lazy: torch submodule on use

        def pre(mod, args):
            x = args[0]
            return (x.to_local() if isinstance(x, DTensor) else x, *args[1:])

        def post(mod, args, out):
            d = DTensor.from_local(out, mesh, (Shard(1),), run_check=False)
            return d.redistribute(mesh, (Replicate(),)).to_local() if self.gather_output else d

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module


def _style(kind: str):
    from torch.distributed.tensor import Replicate, Shard  # lazy: torch submodule on use
    from torch.distributed.tensor.parallel import (  # lazy: torch submodule on use
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    if kind == "gather":
        return PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                  desired_input_kwarg_layouts={"hidden_states": Replicate()})
    if kind == "gather_arg":
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    if kind == "col":
        return ColwiseParallel()
    if kind == "row":
        return RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    if kind == "embed":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
    if kind == "head":
        return ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False)
    raise ValueError(kind)


def layer_plan(prefix: str) -> dict:
    """parallelize_module's plan for one decoder layer at `prefix` (e.g. "model.layers.0")."""
    p = f"{prefix}."
    return {p + "self_attn": _style("gather"), p + "self_attn.q_proj": _style("col"),
            p + "self_attn.k_proj": _style("col"), p + "self_attn.v_proj": _style("col"),
            p + "self_attn.o_proj": _style("row"), p + "mlp": _style("gather_arg"),
            p + "mlp.gate_proj": _style("col"), p + "mlp.up_proj": _style("col"), p + "mlp.down_proj": _style("row")}


def _norm_paths(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if name.endswith(("input_layernorm", "post_attention_layernorm"))
            and m is not model]


def apply(model: nn.Module, tp_mesh) -> list[str]:
    """Parallelize `model` (a Llama-like ``*ForCausalLM``, patched or not) in place over `tp_mesh`; returns
    the names of the parameters whose gradients are partial sums over the tensor-parallel group."""
    from torch.distributed.tensor.parallel import parallelize_module  # lazy: torch submodule on use

    family = getattr(model.config, "model_type", "")
    if family not in FAMILIES:
        raise ValueError(f"tensor parallelism covers {', '.join(FAMILIES)} models, not {family!r}")
    layers = [name for name, m in model.named_modules() if name.rsplit(".", 1)[-1].isdigit()
              and name.rsplit(".", 1)[0].endswith("layers")]
    plan: dict = {}
    for prefix in layers:
        plan.update(layer_plan(prefix))
    base = _base_prefix(model)
    embed = f"{base}embed_tokens" if base is not None and _has(model, f"{base}embed_tokens") else None
    if embed is not None:
        plan[embed] = _style("embed")
    head = _vocab_head(model)
    tied = head is not None and embed is not None and \
        model.get_submodule(head).weight is model.get_submodule(embed).weight
    if head is not None and type(model.get_submodule(head)) is nn.Linear:
        plan[head] = _style("head")
    parallelize_module(model, tp_mesh, plan)
    if head is not None:
        _shard_head(model, head, embed if tied else None, tp_mesh)
    for path in _norm_paths(model):
        SequenceParallelNorm()._apply(model.get_submodule(path), tp_mesh)
    if base is not None and _has(model, f"{base}norm"):
        SequenceParallelNorm(gather_output=True)._apply(model.get_submodule(f"{base}norm"), tp_mesh)
    for name, m in model.named_modules():
        if name.endswith(("self_attn", "attn")):
            _localize_heads(m, tp_mesh.size())
    return [name for name, p in model.named_parameters() if "norm" in name.rsplit(".", 2)[-2]
            and not _is_dtensor(p)]


def _vocab_head(model: nn.Module) -> str | None:
    """The LM head to shard by vocabulary: ``lm_head`` of a Hugging Face ``*ForCausalLM`` (whose forward takes
    the labels); None for anything else (a pipeline stage keeps its head replicated)."""
    from transformers import PreTrainedModel  # lazy: optional transformers

    if not isinstance(model, PreTrainedModel) or not _has(model, "lm_head"):
        return None
    return "lm_head"


def _shard_head(model: nn.Module, head: str, tied_to: str | None, tp_mesh) -> None:
    """Shard the LM head's rows over `tp_mesh` (Shard(0), as ColwiseParallel does for a Linear) and route the
    training loss through the vocabulary-parallel one. A tied head takes the embedding's sharded table."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor  # lazy: torch submodule on use


    module = model.get_submodule(head)
    if tied_to is not None:  # the same [V, H] table: re-tie after parallelize_module gave each its own copy
        module.weight = model.get_submodule(tied_to).weight
    for name in ("weight", "bias"):  # a FusedLossHead's (a Linear's are DTensors already: ColwiseParallel)
        p = getattr(module, name, None)
        if p is not None and not isinstance(p, DTensor):
            setattr(module, name, nn.Parameter(distribute_tensor(p.data, tp_mesh, [Shard(0)]),
                                               requires_grad=p.requires_grad))
    vocab_parallel_head(model, head)


def _base_prefix(model: nn.Module) -> str | None:
    """The decoder's path with a trailing dot ("model."), "" when `model` is the decoder, None when absent."""
    if _has(model, "model.layers"):
        return "model."
    return "" if _has(model, "layers") else None


def _has(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def _localize_heads(attn: nn.Module, tp: int) -> None:
    """Attention modules that store head counts (older transformers) see the local ones; the group size
    (query heads per KV head) is unchanged."""
    for attr in ("num_heads", "num_key_value_heads"):
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, getattr(attn, attr) // tp)


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor  # lazy: torch submodule on use

    return isinstance(t, DTensor)


def reduce_partial_grads(model: nn.Module, names: list[str], tp_mesh) -> None:
    """Sum the gradients of `names` over the tensor-parallel group (in place; FSDP2-sharded ones too)."""
    if not names or tp_mesh.size() == 1:
        return
    params = dict(model.named_parameters())
    grads = [params[n].grad for n in names if n in params and params[n].grad is not None]
    local = [g.to_local() if _is_dtensor(g) else g for g in grads]
    if not local:
        return
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=tp_mesh.get_group())
    offset = 0
    for g in local:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
