"""Collective bandwidth conventions, the alpha-beta fit, and the calibration file the planner reads.

Pure data in, data out (no torch.distributed here), so the planner and the tests import it freely.

nccl-tests conventions (NVIDIA/nccl-tests doc/PERFORMANCE.md and the *GetBw functions; ROCm/rccl-tests
uses the same; summarised in ../shared/facts/training-math.md): time t is the average per-operation
time, algbw = S / t with 1 GB = 1e9 B, busbw = algbw x factor(n), where S is

    all_reduce       the buffer on each rank                 factor 2(n-1)/n
    all_gather       the full gathered array (n x input)     factor (n-1)/n
    reduce_scatter   the full array before scattering        factor (n-1)/n
    all_to_all       the full buffer on each rank            factor (n-1)/n
    broadcast        the buffer                              factor 1
    send_recv        the message                             factor 1

busbw is comparable across rank counts: it is the bandwidth of the bottleneck link when the collective
is bandwidth-bound (an all-reduce moves 2(n-1)/n x S per rank whatever the algorithm).

Alpha-beta model: t(S) = alpha + factor(n) * S / busbw. `fit_alpha_beta` fits alpha >= 0 and busbw > 0 by
least squares on relative error (weights 1/t^2), so the microsecond latencies of small messages weigh as
much as the bandwidth of large ones; the worst relative residual is reported with the fit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wavefront.workbench.document import encode

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
CALIBRATION_SCHEMA = "wavefront.comm.calibration/1"
DOMAINS = ("intra", "inter")


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw for a collective over n ranks (nccl-tests PERFORMANCE.md)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")


def algbw_gbps(size_bytes: float, time_s: float) -> float:
    return size_bytes / time_s / 1e9 if time_s > 0 else math.inf


def busbw_gbps(collective: str, size_bytes: float, time_s: float, n: int) -> float:
    return algbw_gbps(size_bytes, time_s) * bus_factor(collective, n)


@dataclass(frozen=True)
class AlphaBeta:
    """t(S) = alpha + factor(n) * S / busbw, fitted for one collective at one group size."""

    collective: str
    group_size: int
    alpha_us: float
    busbw_gbps: float
    n_points: int
    min_bytes: int
    max_bytes: int
    max_rel_error: float  # worst |fit / measured - 1| over the points

    def time_s(self, size_bytes: float) -> float:
        wire_s = bus_factor(self.collective, self.group_size) * size_bytes / (self.busbw_gbps * 1e9)
        return self.alpha_us * 1e-6 + wire_s


def fit_alpha_beta(collective: str, group_size: int, sizes_bytes: Sequence[float],
                   times_s: Sequence[float]) -> AlphaBeta:
    """Weighted least squares fit of t = alpha + gamma * S (weights 1/t^2), alpha >= 0, gamma > 0;
    busbw = factor(n) / gamma. Needs >= 2 distinct sizes and n >= 2 (a 1-rank collective moves no bytes)."""
    if len(sizes_bytes) != len(times_s):
        raise ValueError("sizes_bytes and times_s must have the same length")
    points = [(float(s), float(t)) for s, t in zip(sizes_bytes, times_s, strict=True) if t > 0 and math.isfinite(t)]
    if len({s for s, _ in points}) < 2:
        raise ValueError(f"{collective}: need timings at >= 2 distinct sizes to fit alpha and beta, got {len(points)}")
    factor = bus_factor(collective, group_size)
    if factor == 0:
        raise ValueError(f"{collective} over {group_size} rank(s) moves no data; fit needs group_size >= 2")
    w = [1.0 / (t * t) for _, t in points]
    sw = sum(w)
    sws = sum(wi * s for wi, (s, _) in zip(w, points, strict=True))
    swss = sum(wi * s * s for wi, (s, _) in zip(w, points, strict=True))
    swt = sum(wi * t for wi, (_, t) in zip(w, points, strict=True))
    swst = sum(wi * s * t for wi, (s, t) in zip(w, points, strict=True))
    det = sw * swss - sws * sws
    alpha, gamma = 0.0, 0.0
    if det > 0:
        gamma = (sw * swst - sws * swt) / det
        alpha = (swt - gamma * sws) / sw
    if det <= 0 or alpha < 0 or gamma <= 0:
        alpha = max(0.0, alpha) if gamma > 0 and det > 0 else 0.0
        gamma = (swst - alpha * sws) / swss
    if gamma <= 0:
        # Times that do not grow with size (latency-bound throughout): bandwidth unmeasurable here.
        gamma = 1e-18
    max_rel = max(abs((alpha + gamma * s) / t - 1.0) for s, t in points)
    sizes = [int(s) for s, _ in points]
    return AlphaBeta(collective, group_size, alpha * 1e6, factor / gamma / 1e9, len(points), min(sizes), max(sizes),
                     max_rel)


@dataclass
class Calibration:
    """What `wavefront comm` stores for the planner: fitted (alpha, busbw) per collective and group size.

    domain "intra" when every rank ran on one node (LOCAL_WORLD_SIZE == WORLD_SIZE), else "inter".
    """

    backend: str
    device: str
    world_size: int
    domain: str
    created_utc: str
    torch_version: str
    fits: list[AlphaBeta] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def fit_for(self, collective: str, group_size: int) -> AlphaBeta | None:
        """The fit at this group size, else the one at the nearest measured size (None if none)."""
        cands = [f for f in self.fits if f.collective == collective]
        if not cands:
            return None
        return min(cands, key=lambda f: (abs(math.log2(f.group_size) - math.log2(max(group_size, 1))), -f.group_size))

    def as_dict(self) -> dict[str, Any]:
        return {"schema": CALIBRATION_SCHEMA, "backend": self.backend, "device": self.device,
                "world_size": self.world_size, "domain": self.domain, "created_utc": self.created_utc,
                "torch_version": self.torch_version, "note": self.note,
                "fits": encode(self.fits), "unsupported": dict(self.unsupported)}


def save_calibration(cal: Calibration, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cal.as_dict(), indent=2) + "\n")


_FIT_FIELDS = {f: t for f, t in (("collective", str), ("group_size", int), ("alpha_us", float), ("busbw_gbps", float),
                                 ("n_points", int), ("min_bytes", int), ("max_bytes", int),
                                 ("max_rel_error", float))}


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file; a missing or malformed file is a ValueError that says what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"calibration file {path} does not exist "
                         f"(write one with `wavefront comm --calibration {path}`)")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"calibration file {path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != CALIBRATION_SCHEMA:
        raise ValueError(f"calibration file {path}: expected an object with schema {CALIBRATION_SCHEMA!r}, "
                         f"got {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r}")
    for key, kind in (("backend", str), ("device", str), ("world_size", int), ("domain", str), ("fits", list)):
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"calibration file {path}: field {key!r} must be a {kind.__name__}")
    if doc["domain"] not in DOMAINS:
        raise ValueError(f"calibration file {path}: domain must be one of {DOMAINS}, got {doc['domain']!r}")
    fits = []
    for i, raw in enumerate(doc["fits"]):
        if not isinstance(raw, dict):
            raise ValueError(f"calibration file {path}: fits[{i}] must be an object")
        try:
            values: dict[str, Any] = {k: t(raw[k]) for k, t in _FIT_FIELDS.items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"calibration file {path}: fits[{i}] lacks or mistypes a field ({exc}); "
                             f"needs {sorted(_FIT_FIELDS)}") from None
        if values["collective"] not in COLLECTIVES:
            raise ValueError(f"calibration file {path}: fits[{i}] collective {values['collective']!r} is not one "
                             f"of {COLLECTIVES}")
        if not values["busbw_gbps"] > 0 or values["alpha_us"] < 0 or values["group_size"] < 2:
            raise ValueError(f"calibration file {path}: fits[{i}] needs busbw_gbps > 0, alpha_us >= 0, "
                             f"group_size >= 2")
        fits.append(AlphaBeta(**values))
    return Calibration(doc["backend"], doc["device"], doc["world_size"], doc["domain"], str(doc.get("created_utc", "")),
                       str(doc.get("torch_version", "")), fits, dict(doc.get("unsupported", {})),
                       str(doc.get("note", "")))
