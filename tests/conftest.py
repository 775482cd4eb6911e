"""Test setup: on a machine without a GPU, kernels run under the Triton interpreter.

TRITON_INTERPRET must be set before the first @triton.jit kernel module is imported, so it is set here,
at collection time. The same tests run compiled on a GPU machine.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def pytest_report_header(config):
    from wavefront import runtime

    info = runtime.describe()
    return f"wavefront backend: {info['backend']} ({info['arch']}, warp {info['warp_size']})"
