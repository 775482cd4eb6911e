"""Launch statistics on planted traces."""

from __future__ import annotations

import numpy as np
import pytest

from wavefront.workbench.trace import analyze
from wavefront.workbench.trace.testing import SynthTrace


def test_planted_launch_stats(planted_path):
    ls = analyze([planted_path]).ranks[0].launch
    # per launch call: first device start - call start (us), the graph launch counted once
    delays = [50, 240, 320, 30, 55, 300, 50, 10, 10, 10]
    d = ls.delay_us
    assert d.n == 10 and d.mean == pytest.approx(np.mean(delays)) and d.p50 == np.median(delays)
    assert d.max == 320 and d.p90 == pytest.approx(np.percentile(delays, 90))
    assert ls.n_graph_launches == 1 and ls.graph_kernels == 3
    # per launching CPU op call: first device start - op start
    op_delays = [60, 242, 325, 35, 56, 302, 55, 15, 15, 12]
    assert ls.op_delay_us.n == 10 and ls.op_delay_us.mean == pytest.approx(np.mean(op_delays))
    assert ls.op_delay_us.p50 == np.median(op_delays) and ls.op_delay_us.max == 325
    expected_apis = ({"hipExtModuleLaunchKernel": 7, "hipGraphLaunch": 1, "hipMemcpyAsync": 1, "hipMemsetAsync": 1}
                     if "amd" in planted_path.name else
                     {"cudaLaunchKernel": 7, "cudaGraphLaunch": 1, "cudaMemcpyAsync": 1, "cudaMemsetAsync": 1})
    assert ls.launches_by_api == expected_apis
    assert [s.launch_cpu_us for s in ls.per_step] == [63.0, 22.0]
    assert [s.sync_cpu_us for s in ls.per_step] == [30.0, 0.0]
    assert [s.n_launch_calls for s in ls.per_step] == [6, 4]
    assert ls.unlinked_device_events == 0


def test_short_kernels(tmp_path):
    t = SynthTrace()
    t.step(1, 0, 500)
    for i, dur in enumerate((2, 4, 8, 50, 100)):
        t.launch(f"k{i}", 100 + 100 * i, dur, launch_ts=10 * i)
    ls = analyze([t.write(tmp_path / "s.json")], short_us=10).ranks[0].launch
    assert (ls.n_kernels, ls.n_short) == (5, 3)
    assert ls.short_count_fraction == pytest.approx(0.6)
    assert ls.short_time_fraction == pytest.approx(14 / 164)
