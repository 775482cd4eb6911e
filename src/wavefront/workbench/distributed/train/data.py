"""Token streams for training: a fixed synthetic corpus, a local text file, or a local token file.

Every source becomes one 1-D int64 tensor of token ids. Batches are windows of ``seq_len`` tokens at
fixed positions: global sample ``s`` starts at ``(s * seq_len) % (n_tokens - seq_len)``. Step ``t`` uses
global samples ``t * global_batch ... + global_batch - 1``; rank ``r`` takes its contiguous share and
splits it into micro-batches. So the data a step sees depends only on the step and the global batch,
never on the world size or on a restart: runs on 1 or 2 ranks, and a run resumed from a checkpoint, see
the same tokens.

Synthetic corpus: a first-order Markov chain over the vocabulary where every token has ``branching``
possible successors (fixed by the seed), so a model can learn it and the loss falls measurably within
tens of steps; its entropy floor is log(branching) nats per token.

Text files are tokenized with the model directory's tokenizer when it has one, else as UTF-8 bytes
(ids 0-255; the vocabulary must have at least 256 entries). Token files are ``.npy`` (a 1-D integer
array) or raw binary (``--token-dtype uint16`` or ``uint32``, the nanoGPT ``.bin`` layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


def synthetic_corpus(vocab_size: int, n_tokens: int = 1 << 16, *, seed: int = 0, branching: int = 4) -> torch.Tensor:
    """A reproducible token stream from a random sparse Markov chain (same seed, same stream everywhere)."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    rng = np.random.default_rng(seed)
    k = min(branching, vocab_size)
    successors = np.stack([rng.choice(vocab_size, size=k, replace=False) for _ in range(vocab_size)])
    picks = rng.integers(0, k, size=n_tokens)
    out = np.empty(n_tokens, dtype=np.int64)
    token = int(rng.integers(0, vocab_size))
    for i in range(n_tokens):
        out[i] = token
        token = int(successors[token, picks[i]])
    return torch.from_numpy(out)


def load_tokens(path: str | Path, *, vocab_size: int, token_dtype: str = "uint16", tokenizer_dir: str | None = None
                ) -> torch.Tensor:
    """Tokens from a local text or token file; raises ValueError naming the problem (missing file, ids
    outside the vocabulary, a byte-level text file for a vocabulary under 256)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"data file {str(p)!r} does not exist")
    if p.suffix == ".npy":
        arr = np.load(p, mmap_mode="r")
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{p}: expected a 1-D integer array, got {arr.dtype} of shape {arr.shape}")
        tokens = torch.from_numpy(np.asarray(arr, dtype=np.int64))
    elif p.suffix == ".bin":
        if token_dtype not in ("uint16", "uint32"):
            raise ValueError(f"token_dtype must be uint16 or uint32, got {token_dtype!r}")
        tokens = torch.from_numpy(np.fromfile(p, dtype=np.dtype(token_dtype)).astype(np.int64))
    else:
        text = p.read_text(encoding="utf-8")
        if tokenizer_dir is not None and Path(tokenizer_dir, "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer  # lazy: optional transformers

            tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
            tokens = torch.tensor(tok(text)["input_ids"], dtype=torch.int64)
        else:
            if vocab_size < 256:
                raise ValueError(f"{p}: a text file without a tokenizer is read as UTF-8 bytes (ids 0-255), but "
                                 f"the model's vocabulary has only {vocab_size} entries")
            tokens = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"{p}: token ids span [{int(tokens.min())}, {int(tokens.max())}] but the model's "
                         f"vocabulary is [0, {vocab_size})")
    return tokens


@dataclass(frozen=True)
class Batches:
    """Deterministic windows over a token stream (see the module docstring)."""

    tokens: torch.Tensor
    seq_len: int
    global_batch: int  # sequences per optimizer step, over all ranks and micro-batches

    def __post_init__(self):
        if self.tokens.numel() < self.seq_len + 1:
            raise ValueError(f"the token stream has {self.tokens.numel()} tokens; at least seq_len + 1 = "
                             f"{self.seq_len + 1} are needed")

    def sample(self, index: int) -> torch.Tensor:
        span = self.tokens.numel() - self.seq_len
        start = (index * self.seq_len) % span
        return self.tokens[start:start + self.seq_len]

    def micro_batch(self, step: int, rank: int, world: int, micro: int, micro_batch_size: int) -> torch.Tensor:
        """[micro_batch_size, seq_len] token ids for one micro-batch of one rank at one step."""
        per_rank = self.global_batch // world
        first = step * self.global_batch + rank * per_rank + micro * micro_batch_size
        return torch.stack([self.sample(first + i) for i in range(micro_batch_size)])
