"""Agreement with Holistic Trace Analysis where the definitions match (skipped when HTA is absent;
``pip install '.[hta]'``). HTA runs in a subprocess: it configures logging and environment globally."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from wavefront.workbench.trace import load_trace
from wavefront.workbench.trace.compat import hta_equivalent
from wavefront.workbench.trace.testing import write_large_trace

pytest.importorskip("hta")

HTA_SCRIPT = """
import json, sys
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
ov = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
print(json.dumps({int(r): {"kernel_time_us": float(tb.loc[r, "kernel_time(us)"]),
                           "idle_time_us": float(tb.loc[r, "idle_time(us)"]),
                           "compute_time_us": float(tb.loc[r, "compute_time(us)"]),
                           "non_compute_time_us": float(tb.loc[r, "non_compute_time(us)"]),
                           "comp_comm_overlap_pctg": float(ov.loc[r, "comp_comm_overlap_pctg"])} for r in tb.index}))
"""


@pytest.mark.parametrize("hta_rounding", [True, False])
def test_temporal_breakdown_and_overlap_agree(tmp_path, hta_rounding):
    for rank in (0, 1):
        write_large_trace(tmp_path / f"rank{rank}.json", 300_000, seed=rank, rank=rank, world_size=2)
    env = dict(os.environ, HTA_DISABLE_NS_ROUNDING="0" if hta_rounding else "1")
    out = subprocess.run([sys.executable, "-c", HTA_SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    for rank in (0, 1):
        ours = hta_equivalent(load_trace(tmp_path / f"rank{rank}.json"), hta_rounding=hta_rounding)
        for key in ("kernel_time_us", "idle_time_us", "compute_time_us", "non_compute_time_us"):
            assert ours[key] == pytest.approx(theirs[str(rank)][key], abs=2e-3), key
        # HTA rounds the percentage to two decimals
        assert ours["comp_comm_overlap_pctg"] == pytest.approx(theirs[str(rank)]["comp_comm_overlap_pctg"], abs=0.006)
