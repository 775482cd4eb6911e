"""Every launch configuration a GPU target's dispatchers choose at the bench shapes, run on the interpreter.

The CPU tests run each kernel with the interpreter's own tables (``cpu`` rows: small tiles, the pointer path
and the TMA path side by side). A configuration that only a GPU target selects (128x256 tiles, 3-4 stages,
warp specialization, tensor descriptors, a persistent grid over the target's SMs, the AMD tables with their
transposed copies and XCD remap) would otherwise be only as right as the CPU configuration that happens to
share its code. This module closes that gap without a GPU:

1. **Enumerate.** For each op in the registry, each bench case (``spec.bench_cases``) and each target, the
   op is recorded without running (``static.capture``, cheap inputs) under
   :func:`wavefront.runtime.assume_target` with the target's SM/CU count. The *configuration key* of a case is
   the set of its launches, forward and backward, each as kernel name + launch options (``num_warps``,
   ``num_stages``, the AMD extras) + constexprs (tiles, stages, ``USE_TMA``, ``WARP_SPECIALIZE``, ``D_SPLIT``,
   ``SPLIT_K``, ``SINGLE_PASS``, ...), with the few constexprs that restate a problem size rather than a
   choice left out (:data:`SIZE_CONSTEXPRS`) and a persistent grid's program count reduced to "persistent".
   Bench cases with equal keys share one configuration.
2. **Shrink.** For each configuration, a small problem (:data:`SMALL_SHAPES`: few rows, short sequences,
   tails in every tiled dim, the bench case's GQA ratio) and a small SM count are searched for whose key under
   the same target equals the bench key: the same kernels with the same tiles, stages, paths and splits, on a
   problem the interpreter finishes in seconds. A small SM count makes a persistent grid walk several tiles per
   program. Host policies that scale with the problem (linear_cross_entropy's chunk budget) are scaled with it
   (:data:`SMALL_CONTEXTS`). :func:`varlen_companion` gives an attention configuration's varlen form.
3. **Run.** :func:`run_config` runs the small problem forward and backward under the interpreter with the
   target assumed, against the float64 reference with the op's accuracy rule (``bench.correctness``), while
   recording the launches, and reports the key that actually ran, so a test can assert it is the chosen one.

Not covered: the inspect variants that no dispatcher chooses and that cannot run here (the Gluon attention
forward: Gluon has no interpreter), listed in :attr:`GpuConfigs.excluded` with the reason; and any configuration
for which no small problem selects the same key (``runnable`` False, the reason in ``note``; counted in
:attr:`GpuConfigs.coverage`).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from wavefront import runtime
from wavefront.kernels._launch import Launch, recording
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case, OpSpec, dtype_name
from wavefront.workbench.hardware import gpu_for_target
from wavefront.workbench.static.capture import capture
from wavefront.workbench.static.variants import VARIANTS

SCHEMA = "wavefront.gpu-configs/1"

#: The GPU targets whose choices differ from the interpreter's most: Hopper (TMA, wgmma, warp specialization),
#: Blackwell (its own TMA and attention tables) and MI300X (the CDNA tables, transposed copies, XCD remap,
#: persistent backward GEMM).
TARGETS: tuple[str, ...] = ("sm_90", "sm_100", "gfx942")

#: The bench dtype: what ``wavefront bench`` and ``wavefront inspect`` run.
DTYPE = torch.bfloat16

#: Constexprs that restate the problem's size, not a dispatcher's choice: the head dim itself (its padded tile
#: BLOCK_D stays in the key), the expert count's power of two, and whether K divides the tile.
SIZE_CONSTEXPRS = frozenset({"HEAD_DIM", "E_POW2", "EVEN_K", "EVEN_N", "ALIGNED_TOKENS"})

#: SM/CU counts tried for the small run, fewest first: few programs walk a persistent grid's tiles in turn.
SMALL_SMS: tuple[int, ...] = (4, 2, 8, 16, 24, 32, 64)


def _value(v: Any) -> str:
    return v if isinstance(v, str) else repr(v)


def launch_signature(la: Launch) -> str:
    """One launch as the configuration it runs: kernel, launch options and choice-bearing constexprs."""
    ce = []
    for k, v in la.constexprs.items():
        if k in SIZE_CONSTEXPRS:
            continue
        if k == "NUM_PROGRAMS":
            v = "persistent" if v else 0
        ce.append(f"{k}={_value(v)}")
    opts = ",".join(f"{k}={_value(v)}" for k, v in sorted(la.options.items()))
    return f"{la.name}[{opts}]({','.join(ce)})"


def launches_key(launches: Mapping[str, list[Launch]]) -> tuple[str, ...]:
    """The configuration key of one op call: its distinct launch signatures per mode, sorted."""
    return tuple(sorted({f"{mode}:{launch_signature(la)}" for mode, ls in launches.items() for la in ls}))


def unmoded(key: Iterable[str]) -> frozenset[str]:
    """A key's launch signatures without their modes (what a recording of a whole check sees)."""
    return frozenset(k.split(":", 1)[1] for k in key)


def key_id(key: Iterable[str]) -> str:
    return f"{zlib.crc32(chr(10).join(key).encode()):08x}"


def config_key(spec: OpSpec, case: Case, target: str, n_sms: int, dtype: torch.dtype = DTYPE, *,
               cheap: bool = True) -> tuple[str, ...]:
    """The key `target` with `n_sms` SMs/CUs chooses for `case` (recorded without running; cheap inputs unless
    the launcher reads input values, as varlen attention does its sequence offsets)."""
    with runtime.assume_target(target, n_sms):
        captured = capture(spec, case, dtype, execute=False, cheap=cheap)
    return launches_key(captured.launches)


# ---------------------------------------------------------------------------------------------------
# Small problems. Per op, candidate dims overrides for a bench case, smallest first; the search keeps the first
# (candidate, SM count) whose key matches. Every candidate puts a tail in each tiled dim (a row width, sequence
# or matrix size that no tile divides) and keeps what the key depends on (the row width's power of two, the
# head dim's padded tile, expert counts, top-k, the GQA ratio).

def _tail(n: int) -> int:
    """A width below `n` with the same next power of two, a multiple of 8 (16-byte rows at 16 bits): 4096 ->
    3584, 14336 -> 12544, 128 -> 112."""
    return max(8, n - max(8, n // 8) // 8 * 8)


def _widths(n: int) -> list[int]:
    """Row widths to try for a bench width `n`, narrowest first: 8 past each power of two from 1024 below `n`
    (a block with an 8-column tail), then :func:`_tail`, then `n`."""
    steps = [(1 << k) + 8 for k in range(10, max(10, n.bit_length())) if (1 << k) + 8 < n]
    return sorted({*steps, _tail(n), n})


def _rows(case: Case) -> Iterator[dict]:
    for rows in (5, 37):
        for width in _widths(case.dims["n_cols"]):
            yield {"n_rows": rows, "n_cols": width}


def _lce(case: Case) -> Iterator[dict]:
    # With the chunk budget scaled by rows (:func:`_lce_budget`), a 16-wide hidden keeps the token chunks, the
    # vocabulary slices and the split structure of the bench case: 32 rows are two whole 16-row chunks (the bench
    # cases' chunks are whole too), and the full vocabulary keeps the width of its last slice.
    # Vocabularies with the bench case's last-slice width (its remainder modulo the 8192-column slices): two
    # slices past the single-pass limit, then eight (a split row starts at 65536 columns), then the bench's.
    vocab = case.dims["n_cols"]
    last = vocab % 8192 or 8192
    for v in (2 * 8192 + last, 8 * 8192 + last, vocab):
        yield {"n_rows": 32, "n_cols": v, "hidden": 16}


def _rope(case: Case) -> Iterator[dict]:
    for seq in (5, 13):
        yield {"batch": 1, "seq": seq}


def _adamw(case: Case) -> Iterator[dict]:
    yield {"numel": 5000 + 77}


def _attention(case: Case) -> Iterator[dict]:
    ratio = case.dims["heads"] // case.dims["kv_heads"]
    d = case.dims["head_dim"]
    for seq, dim in itertools.product((150, 300), (d - d // 4, _tail(d), d)):
        yield {"batch": 1, "kv_heads": 1, "heads": ratio, "seq": seq, "head_dim": dim}


def _linear(case: Case) -> Iterator[dict]:
    for m, n, k in ((300, 264, 200), (300, 520, 200), (520, 520, 520), (1100, 1100, 1100)):
        yield {"M": m, "N": n, "K": k}


def _linear_fp8(case: Case) -> Iterator[dict]:
    # Multiples of 16 (the vendor FP8 GEMM's alignment rule) and K of 32 (MX blocks); every operand over 128
    # rows (block1x32 tiles of 256 rows).
    yield {"M": 304, "N": 272, "K": 288}


def _router(case: Case) -> Iterator[dict]:
    for t in (37, 150):
        yield {"n_tokens": t}


def _permute(case: Case) -> Iterator[dict]:
    for t in (37, 150):
        yield {"n_tokens": t, "hidden": _tail(case.dims["hidden"])}
        yield {"n_tokens": t}


def _grouped(case: Case) -> Iterator[dict]:
    # No grouped entry depends on the sizes (kernels/grouped_config.py): one partial tile per group in every dim.
    e = case.dims["E"]
    for per_group, n, k in ((20, 40, 72), (40, 264, 200)):
        yield {"T": per_group * e + 3, "N": n, "K": k}


#: Why an op's configuration may have no small problem: the smallest problem that selects it, and its cost here.
TOO_LARGE: dict[str, str] = {
    "linear_fp8": "tensorwise and rowwise scales quantize each operand in row blocks as wide as its rows (1024 "
                  "columns and up; rowwise: M > 4096, N > 8192, K > 2048 at the bench case), so the smallest "
                  "problem that selects the configuration is about 1024 x 1024 x 1024, whose FP8 product "
                  "(torch._scaled_mm on the CPU, the vendor's path at these shapes) takes minutes here",
}

SMALL_SHAPES: dict[str, Callable[[Case], Iterator[dict]]] = {
    **{op: _rows for op in ("rms_norm", "add_rms_norm", "layer_norm", "softmax", "cross_entropy", "swiglu",
                            "geglu", "quantize")},
    "linear_cross_entropy": _lce,
    "rope": _rope,
    "adamw_step": _adamw,
    "attention": _attention,
    "linear": _linear,
    "linear_fp8": _linear_fp8,
    "moe_router": _router,
    "moe_permute": _permute,
    "moe_unpermute": _permute,
    "grouped_linear": _grouped,
}


@contextlib.contextmanager
def _lce_budget(bench: Case, small: Case) -> Iterator[None]:
    """linear_cross_entropy sizes its token chunks and dweight slices from a byte budget; scaled by the small
    problem's share of the bench case's rows, the small problem gets the bench case's chunk, slice and split
    structure, so the same kernels run with the same row widths."""
    # The module, not the function ``wavefront.ops`` re-exports under the same name.
    lce = importlib.import_module("wavefront.ops.linear_cross_entropy")
    scale = small.dims["n_rows"] / bench.dims["n_rows"]
    saved = lce.CHUNK_BUDGET_BYTES, lce.DWEIGHT_ACCUMULATOR_MAX_BYTES
    lce.CHUNK_BUDGET_BYTES = max(1, int(saved[0] * scale))
    lce.DWEIGHT_ACCUMULATOR_MAX_BYTES = max(1, int(saved[1] * scale))
    try:
        yield
    finally:
        lce.CHUNK_BUDGET_BYTES, lce.DWEIGHT_ACCUMULATOR_MAX_BYTES = saved


#: Host-side policies that scale with the problem, set for the small run as the bench case would see them.
SMALL_CONTEXTS: dict[str, Callable[[Case, Case], contextlib.AbstractContextManager]] = {
    "linear_cross_entropy": _lce_budget,
}


def small_context(op: str, bench: Case, small: Case) -> contextlib.AbstractContextManager:
    make = SMALL_CONTEXTS.get(op)
    return contextlib.nullcontext() if make is None else make(bench, small)


@dataclass
class GpuConfig:
    """One distinct configuration of one op on one target.

    key: the launch signatures (see :func:`launches_key`); bench_cases: the bench cases that choose it;
    small: a small case choosing the same key with ``small_n_sms`` SMs/CUs (None: none found, see ``note``).
    """

    op: str
    target: str
    key: tuple[str, ...]
    bench_cases: list[str]
    small: Case | None = None
    small_n_sms: int = 0
    note: str = ""
    base: Case | None = None  # the bench case the small problem was shrunk from

    @property
    def id(self) -> str:
        return f"{self.op}-{self.target}-{key_id(self.key)}"

    @property
    def runnable(self) -> bool:
        return self.small is not None

    def as_dict(self) -> dict:
        return {"op": self.op, "target": self.target, "id": self.id, "key": list(self.key),
                "bench_cases": self.bench_cases, "runnable": self.runnable,
                "small": None if self.small is None else {"base": self.small.name, "dims": dict(self.small.dims),
                                                          "n_sms": self.small_n_sms},
                "note": self.note}


@dataclass(frozen=True)
class Excluded:
    """A kernel the inspect tool compiles for a target but no run here can execute, and why."""

    op: str
    target: str
    name: str
    bench_cases: tuple[str, ...]
    reason: str


@dataclass
class GpuConfigs:
    SCHEMA: ClassVar[str] = SCHEMA

    targets: tuple[str, ...]
    dtype: str
    configs: list[GpuConfig] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, dict[str, int]]]:
        """op -> target -> {"chosen": distinct configurations, "runnable": those with a small problem}."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for c in self.configs:
            row = out.setdefault(c.op, {}).setdefault(c.target, {"chosen": 0, "runnable": 0})
            row["chosen"] += 1
            row["runnable"] += c.runnable
        return out

    @property
    def coverage(self) -> tuple[int, int]:
        """(runnable, chosen) over every op and target."""
        return sum(c.runnable for c in self.configs), len(self.configs)

    def as_dict(self) -> dict:
        runnable, chosen = self.coverage
        return {"schema": SCHEMA, "targets": list(self.targets), "dtype": self.dtype,
                "coverage": {"runnable": runnable, "chosen": chosen}, "summary": self.summary(),
                "configs": [c.as_dict() for c in self.configs],
                "excluded": [{"op": e.op, "target": e.target, "name": e.name, "bench_cases": list(e.bench_cases),
                              "reason": e.reason} for e in self.excluded]}


def _find_small(spec: OpSpec, cases: list[Case], key: tuple[str, ...], target: str,
                dtype: torch.dtype) -> tuple[Case | None, int, Case | None, str]:
    shapes = SMALL_SHAPES.get(spec.name)
    if shapes is None:
        return None, 0, None, f"no small-shape rule for {spec.name}"
    arch = runtime.get_arch(target)
    for case in cases:
        for dims in shapes(case):
            small = replace(case, name=f"{case.name}~small", dims={**case.dims, **dims}, slow=False)
            if not spec.supports(small, arch):
                continue
            for n_sms in SMALL_SMS:
                try:
                    with small_context(spec.name, case, small):
                        if config_key(spec, small, target, n_sms, dtype) == key:
                            return small, n_sms, case, ""
                except (ValueError, RuntimeError):
                    break  # the candidate's inputs are invalid for this op: the next candidate
    return None, 0, None, TOO_LARGE.get(spec.name, "no small problem among the candidates selects this configuration")


def gpu_configs(targets: Iterable[str] = TARGETS, ops: Iterable[str] | None = None,
                dtype: torch.dtype = DTYPE) -> GpuConfigs:
    """Every distinct configuration the dispatchers choose on `targets` at the bench shapes, each with the small
    problem that selects it (see the module docstring)."""
    targets = tuple(targets)
    names = list(ops) if ops is not None else list(REGISTRY)
    result = GpuConfigs(targets, dtype_name(dtype))
    for target in targets:
        n_sms = gpu_for_target(target).sm_count
        arch = runtime.get_arch(target)
        for name in names:
            spec = REGISTRY[name]
            by_key: dict[tuple[str, ...], list[Case]] = {}
            for case in spec.bench_cases:
                if spec.supports(case, arch):
                    by_key.setdefault(config_key(spec, case, target, n_sms, dtype), []).append(case)
            for key, cases in by_key.items():
                if not key:
                    continue  # every product deferred to the vendor library: no kernel of ours runs
                small, small_sms, base, note = _find_small(spec, cases, key, target, dtype)
                result.configs.append(GpuConfig(name, target, key, [c.name for c in cases], small, small_sms, note,
                                                base))
            for variant in VARIANTS:
                if variant.op == name and target in variant.targets and not variant.interpreted:
                    covered = tuple(c.name for c in spec.bench_cases if variant.covers(c))
                    if covered:
                        result.excluded.append(Excluded(name, target, variant.name, covered,
                                                        "Gluon has no interpreter; opt-in, no dispatcher chooses "
                                                        "it (its pipeline is checked by an executable model)"))
    return result


#: Packed sequences for the varlen form of an attention configuration: an empty one, one shorter than a block,
#: one as long as the dense small problem, one crossing a block boundary.
VARLEN_SEQLENS = (37, 0, 150, 70)


def varlen_companion(cfg: GpuConfig) -> GpuConfig | None:
    """The varlen form of an attention configuration: the same small problem as packed sequences
    (:data:`VARLEN_SEQLENS`, same heads and head dim), which the target runs with the same kernels, tiles,
    stages and paths, ``VARLEN=True`` the only difference (checked here: None when anything else differs)."""
    if cfg.op != "attention" or cfg.small is None:
        return None
    spec = REGISTRY[cfg.op]
    small = replace(cfg.small, name=f"{cfg.small.name}-varlen", dims={**cfg.small.dims, "seq": 0},
                    options={**cfg.small.options, "seqlens": VARLEN_SEQLENS})
    key = tuple(sorted(k.replace("VARLEN=False", "VARLEN=True") for k in cfg.key))
    try:
        if config_key(spec, small, cfg.target, cfg.small_n_sms, cheap=False) != key:
            return None
    except ValueError:
        return None  # an option the varlen form does not take
    return GpuConfig(cfg.op, cfg.target, key, cfg.bench_cases, small, cfg.small_n_sms,
                     f"varlen form of {cfg.id}", cfg.base)


@dataclass
class ConfigRun:
    """What :func:`run_config` saw: the accuracy check and the key of the launches that ran."""

    check: Any  # bench.correctness.CaseCheck
    ran: frozenset[str]


def run_config(cfg: GpuConfig, check_case: Callable[[OpSpec, Case, torch.dtype], Any],
               dtype: torch.dtype = DTYPE) -> ConfigRun:
    """Run `cfg`'s small problem forward and backward under the interpreter with its target assumed, recording
    the launches; `check_case(spec, case, dtype)` checks it against the float64 reference (the op's accuracy
    rule: bench.correctness.check_case, passed in so that static needs nothing from bench)."""
    if cfg.small is None:
        raise ValueError(f"{cfg.id}: no small problem selects this configuration ({cfg.note})")
    if not runtime.interpreting():
        raise RuntimeError("run_config runs kernels under the Triton interpreter: set TRITON_INTERPRET=1 before "
                           "importing wavefront")
    spec = REGISTRY[cfg.op]
    assert cfg.base is not None
    with (small_context(cfg.op, cfg.base, cfg.small), runtime.assume_target(cfg.target, cfg.small_n_sms),
          recording() as launches):
        check = check_case(spec, cfg.small, dtype)
    return ConfigRun(check, frozenset(launch_signature(la) for la in launches))
