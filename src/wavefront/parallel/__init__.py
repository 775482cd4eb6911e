"""Tensor-, context- and expert-parallel building blocks over torch.distributed: the vocabulary-parallel loss
(:mod:`.vocab_parallel`), ring attention (:mod:`.ring_attention`), expert parallelism (:mod:`.expert_parallel`)
and FSDP2's FP8 weight all-gather (:mod:`.fp8_fsdp`). Library functions: the caller owns the process groups;
importing this package has no side effects."""

from wavefront.parallel.expert_parallel import (
    ExpertParallelExperts,
    all_to_all_rows,
    expert_parallel,
    expert_parameters,
)
from wavefront.parallel.fp8_fsdp import Fp8AllGatherReport, disable_fp8_all_gather, enable_fp8_all_gather
from wavefront.parallel.ring_attention import (
    ring_attention,
    shard_sequence,
    unshard_sequence,
    zigzag_shard,
    zigzag_unshard,
)
from wavefront.parallel.vocab_parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy

__all__ = ["ExpertParallelExperts", "Fp8AllGatherReport", "all_to_all_rows", "disable_fp8_all_gather",
           "enable_fp8_all_gather", "expert_parallel", "expert_parameters", "ring_attention", "shard_sequence",
           "unshard_sequence", "vocab_parallel_cross_entropy", "vocab_parallel_linear_cross_entropy", "zigzag_shard",
           "zigzag_unshard"]
