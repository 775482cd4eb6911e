"""Dashboard figure specs, and the large-trace generator the speed benchmark uses."""

from __future__ import annotations

import json

import pytest

from wavefront.workbench.trace import analyze
from wavefront.workbench.trace.figures import figures, roofline_figure, step_breakdown_figure
from wavefront.workbench.trace.testing import planted_gpu_trace, write_large_trace


def test_step_bar_heights_are_step_times(tmp_path):
    a = analyze([planted_gpu_trace().write(tmp_path / "p.json")])
    fig = step_breakdown_figure(a)
    assert fig["layout"]["barmode"] == "stack" and len(fig["data"]) == 6
    heights = [sum(trace["y"][i] for trace in fig["data"]) for i in range(2)]
    assert heights == pytest.approx([1.0, 1.0])  # ms
    json.dumps(figures(a))  # plain JSON, no plotly objects


def test_roofline_figure_needs_a_known_device(tmp_path):
    known = analyze([planted_gpu_trace().write(tmp_path / "p.json")])
    fig = roofline_figure(known)
    assert fig is not None and fig["layout"]["xaxis"]["type"] == "log"
    assert len(fig["data"][-1]["x"]) == len(known.ranks[0].kernels.roofline)
    unknown = analyze([planted_gpu_trace(device_name="Some Future GPU").write(tmp_path / "u.json")])
    assert roofline_figure(unknown) is None


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_large_trace_generator_loads_and_sums(tmp_path, suffix):
    out = tmp_path / f"big{suffix}"
    info = write_large_trace(out, 400_000, seed=3)
    r = analyze([out]).ranks[0]
    assert len(r.steps) == info["n_steps"] >= 2 and r.complete
    for s in r.steps:
        assert s.total_ns() == s.dur_ns
        assert s.comm_overlapped_ns > 0  # the all-reduce overlaps the backward kernels
    assert r.classification["comm"] == {"launch-op": info["n_steps"]}
