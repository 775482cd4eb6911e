"""The compile workers leave no shutdown noise on the caller's terminal.

On a cold Triton cache, compiling the Gluon attention forward left objects alive inside Triton's extension
and each worker's interpreter shutdown printed 25-48 lines of "nanobind: leaked ..." (no final newline)
after `wavefront bench`'s and `wavefront inspect`'s summaries."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import torch
    from wavefront import runtime
    from wavefront.ops import REGISTRY
    from wavefront.workbench.static.aot import WorkerPool
    from wavefront.workbench.static.inspect import job_for
    from wavefront.workbench.static.variants import VARIANTS, capture_variant

    spec = REGISTRY["attention"]
    variant = next(v for v in VARIANTS if v.name == "gluon_sm90")
    case = next(c for c in spec.bench_cases if variant.covers(c))
    with runtime.assume_target("sm_90", 132):
        launches = capture_variant(spec, case, torch.bfloat16, variant)
    pool = WorkerPool(1)
    result = pool.compile(job_for(launches[0], "sm_90"))
    pool.close()
    print("compiled", result.ok, result.error)
""")


@pytest.mark.skipif(sys.platform == "win32", reason="the compile workers are POSIX subprocesses")
def test_worker_exit_prints_nothing_on_a_cold_cache(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "compiled True None" in out.stdout
    assert "nanobind" not in out.stderr, out.stderr[-2000:]
    assert "leaked" not in out.stderr
