"""Tensor- and context-parallel building blocks over torch.distributed: the vocabulary-parallel loss
(:mod:`.vocab_parallel`) and ring attention (:mod:`.ring_attention`). Library functions: the caller owns the
process groups; importing this package has no side effects."""

from wavefront.parallel.ring_attention import (
    ring_attention,
    shard_sequence,
    unshard_sequence,
    zigzag_shard,
    zigzag_unshard,
)
from wavefront.parallel.vocab_parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy

__all__ = ["ring_attention", "shard_sequence", "unshard_sequence", "vocab_parallel_cross_entropy",
           "vocab_parallel_linear_cross_entropy", "zigzag_shard", "zigzag_unshard"]
