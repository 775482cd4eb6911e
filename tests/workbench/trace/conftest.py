from __future__ import annotations

from pathlib import Path

import pytest

from wavefront.workbench.trace.testing import planted_gpu_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(params=["nvidia", "amd"])
def planted_path(request, tmp_path) -> Path:
    """The planted two-step GPU trace (see synth.planted_gpu_trace), as gzip."""
    return planted_gpu_trace(request.param).write(tmp_path / f"planted_{request.param}.json.gz")
