"""Regression gates. A gate is a list of independent halves; each half compares the present with a
committed baseline and returns findings, one per kernel x target (or op x mode x case) that regressed.

The static half (this module) needs no GPU and is deterministic: it compares ``wavefront inspect`` and
``wavefront traffic`` results with ``benchmarks/baselines/static.json`` and finds

- a kernel that stops compiling for a target, or disappears from the inspection;
- spills that appear (or grow);
- a widest global load or store that narrows, or more narrow (< 128-bit) global accesses than before
  (one tensor losing its vectorization leaves the widest access unchanged), unless the row gained TMA
  operations (copies by TMA have no per-thread width);
- registers per thread that grow by more than 10%;
- occupancy that falls;
- matrix instructions (mma/wgmma/tcgen05/mfma/wmma) that disappear;
- TMA operations or warp specialization (setmaxnreg) that disappear;
- a main-loop wgmma wait depth that falls (toward 0: the matrix units serialized with the softmax), or a
  smallest matrix-instruction N that narrows;
- more block-wide barriers per main-loop iteration, or more 8/16-bit LDS accesses on AMD;
- bytes moved by an op's kernels (plus its host-side work) that grow.

The perf half (timings against a perf baseline, with noise bands) plugs in the same way: a function that
returns a :class:`HalfResult`, added to the list :func:`run_gate` runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA = "wavefront.gate/1"
BASELINE_SCHEMA = "wavefront.gate.static-baseline/1"
DEFAULT_STATIC_BASELINE = Path("benchmarks/baselines/static.json")
#: Registers may grow this much (fractionally) before the gate fails.
REGS_GROWTH = 0.10

# The fields of an inspect row the static baseline keeps (the rest is report detail).
_INSPECT_FIELDS = ("ok", "error", "num_warps", "regs", "sgprs", "agprs", "spill_bytes", "spill_count", "shared_bytes",
                   "widest_load_bits", "widest_store_bits", "narrow_loads", "narrow_stores", "occupancy",
                   "matrix_families", "tma_ops", "setmaxnreg", "mma_wait_depth", "min_mma_n", "loop_barriers",
                   "narrow_lds_ops", "row_pass_barriers", "consumer_warpgroups", "pingpong", "loop_mask_ops",
                   "mma_overlap_depth")
_TRAFFIC_FIELDS = ("error", "kernel_bytes", "host_bytes", "bytes_moved", "unique_bytes", "min_bytes", "ratio_min",
                   "hbm_passes")


@dataclass(frozen=True)
class Finding:
    half: str
    subject: str  # "op/mode/case/kernel@target" or "op/mode/case"
    rule: str  # "compile", "missing", "spills", "load-width", "store-width", "registers", "occupancy",
    #            "matrix", "tma", "setmaxnreg", "mma-wait", "mma-n", "loop-barriers", "row-barriers", "narrow-lds",
    #            "bytes", "hbm-passes", "pingpong", "loop-mask", "mma-overlap",
    #            "pipeline" (a hand-made pipeline's model breaks a rule: pipeline_check.py)
    message: str

    def line(self) -> str:
        return f"{self.subject}: {self.message}"


@dataclass
class HalfResult:
    name: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # informational: new kernels, improvements, versions
    compared: int = 0

    @property
    def passed(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "compared": self.compared, "notes": self.notes,
                "findings": [asdict(f) for f in self.findings]}


GateHalf = Callable[[], HalfResult]


def run_gate(halves: Sequence[GateHalf]) -> list[HalfResult]:
    """Run every half; each is independent (one failing does not stop the others)."""
    return [half() for half in halves]


def gate_document(results: Iterable[HalfResult]) -> dict:
    results = list(results)
    return {"schema": SCHEMA, "passed": all(r.passed for r in results), "halves": [r.as_dict() for r in results]}


# ---------------------------------------------------------------------------------------------------
# Static baseline.


def static_snapshot(inspect_doc: dict, traffic_doc: dict) -> dict:
    """The baseline document: the gated fields of every inspect row and traffic row, keyed."""
    return {
        "schema": BASELINE_SCHEMA,
        "versions": inspect_doc.get("versions", {}),
        "dtype": inspect_doc.get("dtype"),
        "targets": inspect_doc.get("targets", []),
        "inspect": {r["key"]: {k: r.get(k) for k in _INSPECT_FIELDS} for r in inspect_doc["rows"]},
        "traffic": {r["key"]: {k: r.get(k) for k in _TRAFFIC_FIELDS} for r in traffic_doc["rows"]},
    }


def load_baseline(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no static baseline at {p}: create it with `wavefront gate --static --update`")
    doc = json.loads(p.read_text())
    if doc.get("schema") != BASELINE_SCHEMA:
        raise ValueError(f"{p} is not a static baseline (schema {doc.get('schema')!r}, expected {BASELINE_SCHEMA!r})")
    return doc


def write_baseline(doc: dict, path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _bits(b: int | None) -> str:
    return f"{b}-bit" if b else "none"


def compare_inspect(baseline: dict[str, dict], current: dict[str, dict], half: str = "static") -> tuple[
        list[Finding], list[str]]:
    """Findings for kernel x target rows (both keyed by row key, values with the gated fields)."""
    findings: list[Finding] = []
    notes: list[str] = []

    def add(key: str, rule: str, msg: str) -> None:
        findings.append(Finding(half, key, rule, msg))

    for key, base in sorted(baseline.items()):
        cur = current.get(key)
        if cur is None:
            add(key, "missing", "no longer inspected (kernel, case or target gone from the registry walk)")
            continue
        if base.get("ok") and not cur.get("ok"):
            add(key, "compile", f"stopped compiling: {cur.get('error')}")
            continue
        if not cur.get("ok"):
            continue
        b_sp, c_sp = base.get("spill_bytes") or 0, cur.get("spill_bytes") or 0
        b_sc, c_sc = base.get("spill_count") or 0, cur.get("spill_count") or 0
        if (c_sp or c_sc) and not (b_sp or b_sc):
            add(key, "spills", f"spills appeared: {c_sp} B/thread, {c_sc} spill instructions (baseline none)")
        elif c_sp > b_sp:
            add(key, "spills", f"spills grew: {b_sp} -> {c_sp} B/thread")
        # Loads and stores that moved to TMA have no per-thread width: a narrower (or no) widest access
        # alongside more TMA operations is the copy engine taking over, not lost vectorization.
        to_tma = (cur.get("tma_ops") or 0) > (base.get("tma_ops") or 0)
        for what, rule in (("widest_load_bits", "load-width"), ("widest_store_bits", "store-width")):
            b, c = base.get(what) or 0, cur.get(what) or 0
            if c < b and to_tma:
                notes.append(f"{key}: widest global {what.split('_')[1]} {_bits(b)} -> {_bits(c)} with TMA operations "
                             f"{base.get('tma_ops') or 0} -> {cur.get('tma_ops')}")
            elif c < b:
                kind = "load" if "load" in what else "store"
                add(key, rule, f"widest global {kind} narrowed: {_bits(b)} -> {_bits(c)}")
        for what, kind in (("narrow_loads", "load"), ("narrow_stores", "store")):
            b, c = base.get(what) or 0, cur.get(what) or 0
            if c > b:
                add(key, f"{kind}-width", f"narrow (< 128-bit) global {kind}s grew: {b} -> {c} instructions")
        b_r, c_r = base.get("regs") or 0, cur.get("regs") or 0
        if b_r and c_r > b_r * (1 + REGS_GROWTH):
            add(key, "registers", f"registers grew {c_r / b_r - 1:+.0%}: {b_r} -> {c_r} per thread "
                                  f"(limit +{REGS_GROWTH:.0%})")
        b_o, c_o = base.get("occupancy") or 0.0, cur.get("occupancy") or 0.0
        if c_o < b_o - 1e-9:
            add(key, "occupancy", f"occupancy fell: {b_o:.0%} -> {c_o:.0%}")
        lost = sorted(set(base.get("matrix_families") or []) - set(cur.get("matrix_families") or []))
        if lost:
            add(key, "matrix", f"matrix instructions disappeared: {', '.join(lost)}")
        _design_rules(base, cur, lambda rule, msg, key=key: add(key, rule, msg))
    new = sorted(set(current) - set(baseline))
    if new:
        notes.append(f"{len(new)} kernel x target rows not in the baseline (new ops, cases or targets), e.g. {new[0]}")
    return findings, notes


def _design_rules(base: dict, cur: dict, add: Callable[[str, str], None]) -> None:
    """The machine-code design fields. A field the baseline row lacks (a baseline written before the field
    existed) or holds as None (not applicable: no wgmma, no main loop) is not compared."""
    for what, rule, name in (("tma_ops", "tma", "TMA operations"), ("setmaxnreg", "setmaxnreg",
                                                                        "setmaxnreg (warp specialization)")):
        b, c = base.get(what), cur.get(what) or 0
        if b and not c:
            add(rule, f"{name} disappeared: {b} -> 0")
    b, c = base.get("mma_wait_depth"), cur.get("mma_wait_depth")
    if b is not None and (c is None or c < b):
        add("mma-wait", f"main-loop wgmma wait depth fell: {b} -> {'no wgmma' if c is None else c}")
    b, c = base.get("min_mma_n"), cur.get("min_mma_n")
    if b is not None and c is not None and c < b:
        add("mma-n", f"smallest matrix instruction N narrowed: {b} -> {c}")
    b, c = base.get("loop_barriers"), cur.get("loop_barriers")
    if b is not None and c is not None and c > b:
        add("loop-barriers", f"block-wide barriers per main-loop iteration grew: {b} -> {c}")
    b, c = base.get("row_pass_barriers"), cur.get("row_pass_barriers")
    if b is not None and c is not None and c > b:
        add("row-barriers", f"block-wide barriers per row pass grew: {b} -> {c}")
    b, c = base.get("narrow_lds_ops"), cur.get("narrow_lds_ops")
    if b is not None and c is not None and c > b:
        add("narrow-lds", f"8/16-bit LDS accesses grew: {b} -> {c} instructions")
    # Attention-forward design: ping-pong lost, a mask back in the main loop, the math no longer under a wgmma.
    if base.get("pingpong") and not cur.get("pingpong"):
        add("pingpong", "the consumer warpgroups no longer ping-pong in the main loop")
    for what, rule, name in (("loop_mask_ops", "loop-mask", "mask instructions in the main loop grew"),
                             ("mma_overlap_depth", "mma-overlap", "largest main-loop wgmma wait depth fell")):
        b, c = base.get(what), cur.get(what)
        if b is not None and c is not None and (c > b if what == "loop_mask_ops" else c < b):
            add(rule, f"{name}: {b} -> {c}")


def compare_traffic(baseline: dict[str, dict], current: dict[str, dict], half: str = "static") -> tuple[
        list[Finding], list[str]]:
    findings: list[Finding] = []
    notes: list[str] = []
    for key, base in sorted(baseline.items()):
        cur = current.get(key)
        if cur is None:
            findings.append(Finding(half, key, "missing", "no longer counted (op, mode or case gone)"))
            continue
        if cur.get("error") and not base.get("error"):
            findings.append(Finding(half, key, "bytes", f"traffic could not be counted: {cur['error']}"))
            continue
        b, c = base.get("bytes_moved") or 0, cur.get("bytes_moved") or 0
        if c > b:
            findings.append(Finding(half, key, "bytes", f"bytes moved grew {c / b - 1:+.2%}: {b} -> {c} "
                                                        f"(minimum {cur.get('min_bytes')})" if b else
                                    f"bytes moved grew: {b} -> {c}"))
        elif c < b:
            notes.append(f"{key}: bytes moved fell {b} -> {c}")
        b, c = base.get("hbm_passes"), cur.get("hbm_passes")
        if b is not None and c is not None and c > b + 1e-3:
            findings.append(Finding(half, key, "hbm-passes", f"HBM passes per row grew: {b} -> {c}"))
    new = sorted(set(current) - set(baseline))
    if new:
        notes.append(f"{len(new)} traffic rows not in the baseline, e.g. {new[0]}")
    return findings, notes


def static_half(inspect_doc: dict, traffic_doc: dict, baseline: dict) -> HalfResult:
    """Compare present inspect + traffic documents with a static baseline document."""
    current = static_snapshot(inspect_doc, traffic_doc)
    result = HalfResult("static")
    f1, n1 = compare_inspect(baseline.get("inspect", {}), current["inspect"])
    f2, n2 = compare_traffic(baseline.get("traffic", {}), current["traffic"])
    result.findings = f1 + f2
    result.notes = n1 + n2
    result.compared = len(baseline.get("inspect", {})) + len(baseline.get("traffic", {}))
    bv, cv = baseline.get("versions", {}), current.get("versions", {})
    for tool in ("triton", "torch"):
        if bv.get(tool) and cv.get(tool) and bv[tool] != cv[tool]:
            result.notes.append(f"{tool} {bv[tool]} in the baseline, {cv[tool]} now: code generation may differ")
    return result


# ---------------------------------------------------------------------------------------------------
# Perf half: timings and peak memory of a stored run against a baseline run (workbench/bench/regress.py).


def check_pipelines(result: HalfResult) -> HalfResult:
    """Add the hand-made pipelines' model checks (workbench/static/pipeline_models.py) to a half: one finding
    per kernel whose model breaks a rule anywhere on its grid (the first failing configuration named)."""
    from wavefront.workbench.static.pipeline_models import MODELS  # lazy: torch-free import

    for km in MODELS:
        report = km.check()
        if report.failures:
            first = report.failures[0]
            result.findings.append(Finding(result.name, km.kernel, "pipeline",
                                           f"{len(report.failures)} of {report.runs} modeled programs break the "
                                           f"pipeline rules; first {first.params}: {first.violations[0]}"))
        else:
            result.notes.append(f"pipeline model {km.kernel}: {report.runs} programs, every rule holds")
    return result


def is_static_baseline(path: str | Path) -> bool:
    """Whether `path` is a static baseline (else it is taken as a perf baseline: a results document or
    store). Lets one `--baseline` option feed either half."""
    p = Path(path)
    if p.suffix != ".json" or not p.is_file():
        return False
    try:
        return json.loads(p.read_text()).get("schema") == BASELINE_SCHEMA
    except (OSError, ValueError, AttributeError):
        return False
