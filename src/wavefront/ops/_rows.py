"""Shared case regimes and input makers for row-wise ops (norms, softmax, and later the losses).

Each regime exists for a reason a kernel can get wrong; the reasons travel with the cases into test ids,
the bench table and the report.
"""

from __future__ import annotations

import torch

from wavefront.ops._spec import Case
from wavefront.shapes import MODELS, bench_rows

# (name, n_rows, n_cols, layout, reason, slow)
_REGIMES = (
    ("one_row", 1, 4096, "contiguous", "a single row: a grid of one program", False),
    ("npow2", 5, 1000, "contiguous", "non-power-of-two width: masked tail inside one block", False),
    ("width_one", 4, 1, "contiguous", "a width of one column: every reduction is trivial", False),
    ("rows_pow2", 64, 256, "contiguous", "many rows, power-of-two width: no masked lanes", False),
    ("batched", 42, 384, "batched", "leading batch dims [2, 3, 7] flatten into rows", False),
    ("strided", 8, 512, "strided", "row stride larger than the width (a column slice): no copy", False),
    ("transposed", 16, 96, "transposed", "last dim not unit-stride: copied once", False),
    ("wide", 2, 20000, "contiguous", "wider than one block (16384): the looped two-pass path", False),
    ("vocab_262k", 1, 262144, "contiguous", "262,144 columns (Gemma 3 vocab): 32 blocks per row", False),
    ("many_rows", 2048, 4096, "contiguous", "thousands of rows: persistent backward programs loop", True),
)


def row_cases(*, include: tuple[str, ...] | None = None, extra: tuple[Case, ...] = ()) -> tuple[Case, ...]:
    """The shared regimes (optionally a subset by name), plus op-specific extras."""
    cases = tuple(
        Case(name, reason, {"n_rows": n_rows, "n_cols": n_cols}, layout=layout, slow=slow)
        for name, n_rows, n_cols, layout, reason, slow in _REGIMES
        if include is None or name in include
    )
    return cases + extra


def bench_row_cases(widths: dict[str, int] | None = None, options: dict | None = None) -> tuple[Case, ...]:
    """Real-model row widths (hidden sizes by default), rows from wavefront.shapes.bench_rows."""
    if widths is None:
        widths = {}
        for m in ("llama3-8b", "llama3-70b", "llama3-405b", "qwen2.5-7b"):
            widths.setdefault(f"{m}_hidden", MODELS[m].hidden)
        widths["wide_65536"] = 65536  # the widest norm the foundation targets (32K x 65K is the published anchor)
    return tuple(
        Case(name, f"{n_cols} columns", {"n_rows": bench_rows(n_cols), "n_cols": n_cols}, dict(options or {}))
        for name, n_cols in widths.items()
    )


def randn(shape, dtype: torch.dtype, device, gen: torch.Generator, scale: float = 1.0,
          shift: float = 0.0) -> torch.Tensor:
    """Deterministic normal data made on the CPU (same numbers on every device), then moved."""
    t = torch.randn(shape, generator=gen, dtype=torch.float32) * scale + shift
    return t.to(dtype=dtype, device=device)


def row_tensor(case: Case, dtype: torch.dtype, device, gen: torch.Generator, scale: float = 1.0,
               shift: float = 0.0) -> torch.Tensor:
    """An [n_rows, n_cols] operand laid out as the case says."""
    n_rows, n_cols = case.dims["n_rows"], case.dims["n_cols"]
    if case.layout == "contiguous":
        return randn((n_rows, n_cols), dtype, device, gen, scale, shift)
    if case.layout == "batched":
        if n_rows % 6:
            raise ValueError(f"case {case.name}: the batched layout needs n_rows divisible by 6")
        return randn((2, 3, n_rows // 6, n_cols), dtype, device, gen, scale, shift)
    if case.layout == "strided":
        return randn((n_rows, n_cols + 64), dtype, device, gen, scale, shift)[:, :n_cols]
    if case.layout == "transposed":
        return randn((n_cols, n_rows), dtype, device, gen, scale, shift).t()
    raise ValueError(f"case {case.name}: unknown layout {case.layout!r}")


def numel(case: Case) -> int:
    return case.dims["n_rows"] * case.dims["n_cols"]
