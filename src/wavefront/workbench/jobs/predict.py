"""Predicted fraction of peak per kernel from the committed static baseline (``workbench.static.predict``):
a model, never a measurement.

    from wavefront.workbench.jobs import predict
    predict.predict(predict.PredictRequest(targets=("sm_90",))).as_dict()   # wavefront.predict/1

The inspect and traffic facts come from the static baseline document (``benchmarks/baselines/static.json`` by
default); the case shapes from the op registry; the tile each matrix-unit kernel runs at a case from the same
config tables its launcher reads (``kernels/attention_config``, ``matmul_config``, ``grouped_config`` and the FP8
GEMM's), so a changed table changes the prediction. ``wavefront predict`` prints the table.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from wavefront.archs import Arch, get_arch
from wavefront.kernels import attention_fa3, attention_gluon, grouped_config, linear_fp8
from wavefront.kernels.attention_config import attention_config, padded_head_dim
from wavefront.kernels.matmul_config import gemm_config, tma_capable, tma_config
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Mode
from wavefront.workbench.jobs.request import RequestError
from wavefront.workbench.static import predict as pm
from wavefront.workbench.static.gate import DEFAULT_STATIC_BASELINE

#: Ops whose time is not our kernels': the fused linear cross-entropy's logits GEMM is the vendor library's.
NOT_MODELLED = {"linear_cross_entropy": "the logits GEMM is the vendor library's (torch.matmul), not our kernel"}
#: Why a matrix-unit kernel row has no loop shape, by (op, mode); others: no entry for that kernel or case.
NO_LOOP = {("linear_fp8", "bwd"): "the backward products' operand and scale layouts are not mapped",
           ("attention", "bwd"): "no single-program tile (d_split) or no entry for this kernel"}
#: The case names of the table in docs/predicted-peak.md: Llama-3-8B's bench shapes (its 128k vocabulary for
#: softmax and cross-entropy), and Mixtral-8x7B's for the MoE ops that have no Llama-3-8B case.
DOC_CASES = ("llama3-8b", "llama3_128k", "vocab_128k", "mixtral-8x7b")

#: FP32 element operations per score element inside the attention loops, and their source. Forward: the
#: FA3-schedule loop's ~510 non-wgmma SASS instructions per 64 scores a thread (docs/kernels-attention-gemm.md);
#: dK/dV: the doc's ~1,000 cycles of elementwise work per 8,192 scores on sm_90 (x 128 lanes); dQ: assumed
#: (P recomputed and dS formed, without dV's P^T conversion).
ATTENTION_VALU_PER_SCORE = {"fwd": 8, "bwd_dkdv": 16, "bwd_dq": 12}
#: Matrix products per attention loop iteration (each 2 x BLOCK_M x BLOCK_N x head_dim FLOPs).
ATTENTION_PRODUCTS = {"fwd": 2, "bwd_dkdv": 4, "bwd_dq": 3}
#: The default attention kernels (pointer and TMA forms of one program) -> their config kind.
ATTENTION_KINDS = {"_attn_fwd_kernel": "fwd", "_attn_fwd_tma_kernel": "fwd", "_attn_bwd_dkdv_kernel": "bwd_dkdv",
                   "_attn_bwd_dkdv_tma_kernel": "bwd_dkdv", "_attn_bwd_dq_kernel": "bwd_dq"}
#: FP32 operations per accumulator element per K step where block scales are applied by the CUDA cores
#: (acc += partial x scale_a x scale_b), and per A-tile element where the backward forms dz = dy x act'(z).
BLOCK_SCALE_VALU = 2
PROLOGUE_VALU = 3


@dataclass(frozen=True)
class PredictRequest:
    baseline: str = str(DEFAULT_STATIC_BASELINE)  # a static baseline document (wavefront.gate.static-baseline/1)
    targets: tuple[str, ...] = ("sm_90", "sm_100", "gfx942")
    ops: tuple[str, ...] = ()  # () = every op in the baseline


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _epilogue_flags(case: str) -> tuple[bool, bool]:
    """(has an activation, has a residual) for a linear bench case name."""
    return any(a in case for a in ("silu", "gelu", "relu")), case.endswith("_res") or "_res_" in case


# ---------------------------------------------------------------------------------------------------
# Loop shapes: the tile each matrix-unit kernel runs at a bench case, from the kernels' config tables.


def _query_stationary(S: int, bm: int, bn: int, causal: bool) -> tuple[float, float]:
    """(mean key blocks per query tile, counted / executed score pairs) for the forward and dQ loops."""
    blocks = executed = counted = 0
    n_tiles = _ceil(S, bm)
    for i in range(n_tiles):
        rows = min(S, (i + 1) * bm) - i * bm
        keys = min(S, (i + 1) * bm) if causal else S
        nb = _ceil(keys, bn)
        blocks += nb
        executed += rows * nb * bn
        counted += sum(i * bm + r + 1 for r in range(rows)) if causal else rows * S
    return blocks / n_tiles, counted / executed


def _key_stationary(S: int, bm: int, bn: int, causal: bool) -> tuple[float, float]:
    """(mean query blocks per key tile, counted / executed score pairs) for the dK/dV loop."""
    blocks = executed = counted = 0
    n_tiles = _ceil(S, bn)
    nq = _ceil(S, bm)
    for j in range(n_tiles):
        cols = min(S, (j + 1) * bn) - j * bn
        first = (j * bn) // bm if causal else 0
        nb = nq - first
        blocks += nb
        executed += cols * nb * bm
        counted += sum(S - (j * bn + c) for c in range(cols)) if causal else cols * S
    return blocks / n_tiles, counted / executed


def attention_loop(kernel: str, dims: Mapping[str, int], case: str, arch: Arch) -> pm.LoopShape | None:
    """The loop of an attention kernel at a case on `arch`, or None (d_split tiles: not modelled)."""
    d = padded_head_dim(dims["head_dim"])
    S, B, H, KVH = dims["seq"], dims["batch"], dims["heads"], dims["kv_heads"]
    causal = "causal" in case
    if kernel == "_attn_fwd_sm90_fa3":
        kind, bm, bn, note = "fwd", attention_fa3.BLOCK_M, attention_fa3.BLOCK_N, "FA3-schedule kernel (opt-in)"
    elif kernel == "_attn_fwd_sm90_gluon":
        kind, bm, bn, note = "fwd", attention_gluon.BLOCK, attention_gluon.BLOCK, "Gluon kernel (opt-in)"
    else:
        kind = ATTENTION_KINDS.get(kernel, "")
        if not kind:
            return None
        cfg = attention_config(kind, dims["head_dim"], torch.bfloat16, arch)  # type: ignore[arg-type]
        if cfg.d_split > 1:
            return None
        bm, bn, note = cfg.BLOCK_M, cfg.BLOCK_N, ""
    if kind == "bwd_dkdv":
        iters, useful = _key_stationary(S, bm, bn, causal)
        iters *= H // KVH  # the program loops over the query heads of its K/V head
        tiles = B * KVH * _ceil(S, bn)
    else:
        iters, useful = _query_stationary(S, bm, bn, causal)
        tiles = B * H * _ceil(S, bm)
    scores = bm * bn
    return pm.LoopShape(tensor_flop=ATTENTION_PRODUCTS[kind] * 2 * bm * bn * d,
                        valu_ops=ATTENTION_VALU_PER_SCORE[kind] * scores, mufu_ops=scores,
                        iterations_per_tile=iters, tiles=tiles, useful=useful,
                        note=" ".join(p for p in (f"{bm}x{bn} d{d}", note) if p))


def _gemm_loop(bm: int, bn: int, bk: int, M: int, N: int, K: int, *, valu_per_step: float = 0.0, groups: int = 1,
               dtype: str = "bf16", note: str = "") -> pm.LoopShape:
    tiles = groups * _ceil(M, bm) * _ceil(N, bn)
    return pm.LoopShape(tensor_flop=2 * bm * bn * bk, valu_ops=valu_per_step, mufu_ops=0,
                        iterations_per_tile=_ceil(K, bk), tiles=tiles, dtype=dtype,  # type: ignore[arg-type]
                        note=" ".join(p for p in (f"{bm}x{bn}x{bk}", note) if p))


def linear_loop(kernel: str, mode: str, dims: Mapping[str, int], case: str, arch: Arch) -> pm.LoopShape | None:
    M, N, K = dims["M"], dims["N"], dims["K"]
    act, res = _epilogue_flags(case)
    base = kernel.split("#")[0]
    second = kernel.endswith("#2")
    if mode == "fwd":
        products = [(M, N, K)]
        kind = "epilogue" if act else "residual" if res else "light"
        heavy = act or res
    else:  # dx [M, K] reduces over N; dW [N, K] (the second launch) reduces over M
        products = [(N, K, M) if second else (M, K, N)]
        kind = "prologue" if act else "light"
        heavy = True
    m, n, k = products[0]
    if base.endswith("_tma_kernel"):
        cfg = tma_config(m, n, k, torch.bfloat16, arch, kind)  # type: ignore[arg-type]
        if cfg is None:
            return None
    elif base in ("_linear_fwd_kernel", "_linear_bwd_kernel"):
        cfg = gemm_config(m, n, k, torch.bfloat16, arch, heavy=heavy)
    else:
        return None
    prologue = mode == "bwd" and act and base.endswith("_tma_kernel")
    return _gemm_loop(cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, m, n, k,
                      valu_per_step=PROLOGUE_VALU * cfg.BLOCK_M * cfg.BLOCK_K if prologue else 0.0,
                      note="dz prologue" if prologue else "")


def grouped_loop(kernel: str, mode: str, dims: Mapping[str, int], case: str, arch: Arch) -> pm.LoopShape | None:
    T, K, N, E = dims["T"], dims["K"], dims["N"], dims["E"]
    rows = _ceil(T, E)  # tokens per expert under uniform routing
    product: grouped_config.Product
    if kernel == "_grouped_gemm_swiglu_kernel":
        product = "fwd_swiglu"
    elif kernel == "_grouped_gemm_kernel":
        product = "fwd" if mode == "fwd" else "dx"
    elif kernel == "_grouped_dw_kernel":
        product = "dw"
    else:
        return None
    cfg = grouped_config.table_entry(product, arch, tma_capable(arch))
    bn = 2 * cfg.BLOCK_N if product == "fwd_swiglu" else cfg.BLOCK_N  # gate and up halves side by side
    m, n, k = {"fwd": (rows, N, K), "fwd_swiglu": (rows, N, K), "dx": (rows, K, N), "dw": (N, K, rows)}[product]
    return _gemm_loop(cfg.BLOCK_M, bn, cfg.BLOCK_K, m, n, k, groups=E, note="uniform routing")


def fp8_loop(kernel: str, mode: str, dims: Mapping[str, int], case: str, arch: Arch) -> pm.LoopShape | None:
    if mode != "fwd":
        return None  # the backward products' scale layouts are not mapped here
    M, N, K = dims["M"], dims["N"], dims["K"]
    group_k, b_rows = (128, 128) if "blockwise" in case else (32, 1) if "mxfp8" in case else (0, 0)
    if kernel == "_mx_gemm_kernel":
        if arch.name not in linear_fp8.MX_NATIVE_CONFIGS:
            return None
        cfg, in_loop = linear_fp8.MX_NATIVE_CONFIGS[arch.name], False
    elif kernel in linear_fp8.TMA_KERNELS:
        tma = linear_fp8.fp8_tma_config(arch, group_k, False)
        if tma is None:
            return None
        cfg, in_loop = tma, group_k > 0
    elif kernel == "_fp8_gemm_kernel":
        cfg, in_loop = linear_fp8.fp8_gemm_config(M, N, K, group_k, b_rows, arch), group_k > 0
    else:
        return None
    note = "block scales in the loop" if in_loop else ""
    if kernel in linear_fp8.TMA_KERNELS:
        note = " ".join(p for p in (note, "opt-in TMA kernel") if p)
    return _gemm_loop(cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, M, N, K, dtype="fp8",
                      valu_per_step=BLOCK_SCALE_VALU * cfg.BLOCK_M * cfg.BLOCK_N if in_loop else 0.0, note=note)


_GEMM_LOOPS = {"linear": linear_loop, "grouped_linear": grouped_loop, "linear_fp8": fp8_loop}


def loop_shape(op: str, mode: str, case: str, kernel: str, target: str) -> pm.LoopShape | None:
    """The LoopShape of a matrix-unit kernel row of the baseline, or None where the model has none."""
    if op not in REGISTRY or (op != "attention" and op not in _GEMM_LOOPS):
        return None
    cases = {c.name: c for c in REGISTRY[op].bench_cases}
    if case not in cases:
        return None
    dims, arch = dict(cases[case].dims), get_arch(target)
    if op == "attention":
        return attention_loop(kernel, dims, case, arch)
    return _GEMM_LOOPS[op](kernel, mode, dims, case, arch)


def bench_min_bytes(op: str, mode: str, case: str) -> int | None:
    """The op's minimum bytes (bf16) at its bench case `case`, or None where the registry has no such case."""
    spec = REGISTRY.get(op)
    found = [c for c in spec.bench_cases if c.name == case] if spec else []
    return int(spec.min_bytes(found[0], torch.bfloat16, cast(Mode, mode))) if spec and found else None


# ---------------------------------------------------------------------------------------------------
# The job.


def _split(key: str) -> tuple[str, str, str, str, str]:
    path, target = key.rsplit("@", 1)
    op, mode, case, kernel = path.split("/", 3)
    return op, mode, case, kernel, target


def _traffic_for(traffic: Mapping[str, Any], op: str, mode: str, case: str) -> tuple[str, Mapping[str, Any]] | None:
    """The traffic row of op/mode/case, else the op's mode's largest counted case (ops whose traffic cases are
    not their bench cases)."""
    exact = traffic.get(f"{op}/{mode}/{case}")
    if exact is not None:
        return case, exact
    prefix = f"{op}/{mode}/"
    same = [(k.removeprefix(prefix), v) for k, v in traffic.items() if k.startswith(prefix) and not v.get("error")]
    return max(same, key=lambda kv: (kv[1]["min_bytes"], kv[0])) if same else None


def predict_baseline(baseline: Mapping[str, Any], targets: tuple[str, ...], ops: tuple[str, ...] = (),
                     source: str = "") -> pm.PredictReport:
    """Every row of a static baseline document the model covers, for `targets` (see the module docstring)."""
    inspect: Mapping[str, Mapping[str, Any]] = baseline.get("inspect", {})
    traffic: Mapping[str, Mapping[str, Any]] = baseline.get("traffic", {})
    by_case: dict[tuple[str, str, str, str], list[tuple[str, Mapping[str, Any]]]] = defaultdict(list)
    for key, row in inspect.items():
        op, mode, case, kernel, target = _split(key)
        if target in targets and (not ops or op in ops):
            by_case[(op, mode, case, target)].append((kernel, row))
    matrix_ops = {_split(k)[0] for k, r in inspect.items() if r.get("matrix_families")}
    rows: list[pm.PredictedRow] = []
    for (op, mode, case, target), kernels in sorted(by_case.items()):
        if op in NOT_MODELLED:
            rows.append(pm.PredictedRow(op, mode, case, "(op)", target, "compute", "-", None,
                                        flags=[f"not modelled: {NOT_MODELLED[op]}"]))
            continue
        matrix = [(k, r) for k, r in sorted(kernels) if r.get("matrix_families")]
        if not matrix and op in matrix_ops:
            rows.append(pm.PredictedRow(op, mode, case, "(op)", target, "compute", "-", None,
                                        flags=["not modelled: no matrix kernel of ours here (the vendor library "
                                               "runs the product on this target)"]))
            continue
        if not matrix:
            found = _traffic_for(traffic, op, mode, case)
            if found is None:
                rows.append(pm.PredictedRow(op, mode, case, "(op)", target, "memory", "HBM bandwidth", None,
                                            flags=["no traffic row"]))
                continue
            t_case, t_row = found
            rows.append(pm.predict_memory(op, mode, case, target, t_row, [r for _, r in kernels], t_case,
                                          bench_min_bytes=bench_min_bytes(op, mode, case)))
            continue
        by_kernel: dict[str, pm.PredictedRow] = {}
        for kernel, row in matrix:
            loop = loop_shape(op, mode, case, kernel, target)
            if loop is None:
                why = NO_LOOP.get((op, mode), "no loop shape for this kernel or case")
                rows.append(pm.PredictedRow(op, mode, case, kernel, target, "compute", "-", None,
                                            flags=[f"not modelled: {why}"]))
                continue
            by_kernel[kernel] = pm.predict_compute(op, mode, case, kernel, target, row, loop)
            rows.append(by_kernel[kernel])
        dkdv = by_kernel.get("_attn_bwd_dkdv_kernel") or by_kernel.get("_attn_bwd_dkdv_tma_kernel")
        if op == "attention" and mode == "bwd" and dkdv is not None and "_attn_bwd_dq_kernel" in by_kernel:
            parts = [(dkdv, float(ATTENTION_PRODUCTS["bwd_dkdv"])),
                     (by_kernel["_attn_bwd_dq_kernel"], float(ATTENTION_PRODUCTS["bwd_dq"]))]
            rows.append(pm.combine(op, mode, case, target, parts, 5.0, "dense bf16 matrix peak (5 counted products)"))
    return pm.PredictReport(rows, source)


def predict(request: PredictRequest) -> pm.PredictReport:
    """A PredictReport (wavefront.predict/1) over the request's static baseline."""
    for t in request.targets:
        if t not in pm.TARGETS:
            raise RequestError("targets", f"must be among {', '.join(pm.TARGETS)}; got {t!r}")
    path = Path(request.baseline)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RequestError("baseline", f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or "inspect" not in doc or "traffic" not in doc:
        raise RequestError("baseline", f"{path} is not a static baseline document (no 'inspect' and 'traffic')")
    unknown = [o for o in request.ops if o not in REGISTRY]
    if unknown:
        raise RequestError("ops", f"unknown op {unknown[0]!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    return predict_baseline(doc, request.targets, request.ops, source=str(path))


# ---------------------------------------------------------------------------------------------------
# The table (docs/predicted-peak.md holds its output for the committed baseline).


def _pct(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


def _cell(row: pm.PredictedRow) -> str:
    low, high = _pct(row.predicted), _pct(row.predicted_high)
    return low if row.predicted_high is None or high == low else f"{low.removesuffix('%')}-{high}"


def markdown(report: pm.PredictReport, *, cases: tuple[str, ...] = ()) -> str:
    """The report as Markdown tables: matrix-unit kernels, then memory-bound ops; one column per target.
    cases: only rows whose case starts with one of these (() = all)."""
    targets = sorted({r.target for r in report.rows}, key=list(pm.TARGETS).index)
    keep = [r for r in report.rows if not cases or r.case.startswith(cases)]
    out: list[str] = []
    for bound, title in (("compute", "Matrix-unit kernels (fraction of the dense matrix peak of the dtype)"),
                         ("memory", "Memory-bound ops (fraction of HBM bandwidth)")):
        grouped: dict[tuple[str, str, str, str], dict[str, pm.PredictedRow]] = defaultdict(dict)
        for r in keep:
            if r.bound == bound:
                grouped[(r.op, r.mode, r.case, r.kernel)][r.target] = r
        if not grouped:
            continue
        out += [f"**{title}** - {pm.LABEL}", "",
                "| op / mode / case | kernel | " + " | ".join(targets) + " | notes |",
                "|---|---|" + "---|" * len(targets) + "---|"]
        for (op, mode, case, kernel), per in sorted(grouped.items()):
            cells = [_cell(per[t]) if t in per else "" for t in targets]
            same = len({tuple(r.flags) for r in per.values()}) == 1
            notes = (list(next(iter(per.values())).flags) if same
                     else [f"{t}: {', '.join(per[t].flags)}" for t in targets if t in per and per[t].flags])
            out.append(f"| {op}/{mode}/{case} | {kernel} | " + " | ".join(cells) + f" | {'; '.join(notes)} |")
        out.append("")
    return "\n".join(out)
