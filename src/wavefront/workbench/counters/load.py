"""Recognise a counter profile by its content (never its file name) and read it.

Binary files are Nsight Compute reports (read through ``ncu_report``); text files are CSV whose header says
which tool wrote it (:mod:`.ncu`, :mod:`.rocprof`). Anything else (JSON, a trace, a truncated or empty file)
is a :class:`CountersLoadError` naming the file and the formats that are read.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from wavefront.workbench.counters import ncu, rocprof
from wavefront.workbench.counters.model import CountersLoadError, Profile

EXPECTED = ("an Nsight Compute report (.ncu-rep) or `ncu --csv --page raw` export, a rocprofv3 --pmc "
            "counter_collection.csv, or a rocprof-compute pmc_perf.csv")
#: What each derived quantity needs, for the "not measured" notes.
_GROUPS = (("duration_ns", "duration"), ("tensor_flops", "tensor/MFMA FLOPs"), ("vector_flops", "FMA/VALU FLOPs"),
           ("dram_bytes", "DRAM/HBM bytes"), ("l2_bytes", "L2 bytes"), ("l1_bytes", "L1 bytes"),
           ("achieved_occupancy", "achieved occupancy"), ("registers", "registers"))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip() and not line.startswith("=="):
            return line
    return ""


def load(path: str | Path) -> Profile:
    """Read one profile; CountersLoadError (one line naming the file) when it is not one of :data:`EXPECTED`."""
    p = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise CountersLoadError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if not raw.strip():
        raise CountersLoadError(f"{p}: empty file; expected {EXPECTED}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text[:4096]:
        profile = ncu.read_report(p)
    else:
        if text.lstrip().startswith(("{", "[")):
            raise CountersLoadError(f"{p}: a JSON document; counters are read from CSV (rocprofv3 "
                                    "--output-format csv; ncu --csv --page raw); expected " + EXPECTED)
        header = next(csv.reader(io.StringIO(_first_line(text))), [])
        if ncu.is_ncu_header(header):
            profile = ncu.read_csv(text, p)
        elif rocprof.is_v3_header(header):
            profile = rocprof.read_v3(text, p)
        elif rocprof.is_perf_header(header):
            profile = rocprof.read_perf(text, p)
        else:
            shown = ", ".join(header[:6]) + (", ..." if len(header) > 6 else "")
            raise CountersLoadError(f"{p}: unrecognised columns ({shown or 'none'}); expected {EXPECTED}")
    if not profile.launches:
        raise CountersLoadError(f"{p}: no kernel launches in the profile")
    for attr, what in _GROUPS:
        if all(getattr(la, attr) is None and not (attr == "achieved_occupancy" and rocprof.WAVES_X_CUS in la.metrics)
               for la in profile.launches):
            profile.notes.append(f"{what}: not measured (the counters it needs are not in {Path(p).name})")
    return profile
