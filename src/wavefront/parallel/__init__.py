"""Tensor- and context-parallel building blocks over torch.distributed: the vocabulary-parallel loss
(:mod:`.vocab_parallel`) and ring attention (:mod:`.ring_attention`). Library functions: the caller owns the
process groups; importing this package has no side effects."""

from wavefront.parallel.vocab_parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy

__all__ = ["vocab_parallel_cross_entropy", "vocab_parallel_linear_cross_entropy"]
