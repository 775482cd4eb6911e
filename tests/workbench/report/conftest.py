"""A results store with a CPU correctness run and two synthetic GPU runs (test fixtures: the timings are
made-up numbers that exercise the charts, labelled as such, never performance claims)."""

from __future__ import annotations

import numpy as np
import pytest
from _report_docs import inspect_document, traffic_document

from wavefront.workbench.bench.records import CorrectnessRow, Measurement, RunInfo, StoredRun
from wavefront.workbench.bench.store import ResultStore

FIXTURE_DEVICE = "NVIDIA H100 80GB HBM3"


def _gpu_run(day: int, scale: float) -> StoredRun:
    rng = np.random.default_rng(day)
    info = RunInfo(
        f"2026-01-0{day}T00:00:00Z",
        "synthetic test fixture",
        f"{day}" * 40,
        False,
        FIXTURE_DEVICE,
        "sm_90",
        "cuda",
        "2.13.0",
        "3.9.0",
        "3.11",
        "fixture",
        "gpu",
        copy_gbps=4000.0,
        device_model="h100",
        extra={"fixture": True},
    )
    ms = []
    for case in ("llama3-8b_hidden", "wide_65536"):
        for mode in ("fwd", "bwd"):
            for prov, factor in (("wavefront", 1.0), ("eager", 2.5), ("torch_compile", 1.6), ("liger", None)):
                if factor is None:
                    ms.append(Measurement("rms_norm", case, mode, "bf16", prov, "unavailable", "not installed"))
                    continue
                med = 200.0 * factor * scale
                ms.append(
                    Measurement(
                        "rms_norm",
                        case,
                        mode,
                        "bf16",
                        prov,
                        "ok",
                        "",
                        {"n_rows": 32768},
                        "events",
                        "flush 256 MiB",
                        5,
                        1,
                        list(med * np.exp(rng.normal(0, 0.01, 30))),
                        1.3e8,
                        537_000_000,
                        gbps=537e6 / (med * 1e-6) / 1e9,
                        tflops=1.3e8 / (med * 1e-6) / 1e12,
                        peak_mem_bytes=1 << 28,
                    )
                )
    return StoredRun(info, ms)


@pytest.fixture
def store_path(tmp_path):
    return make_store(tmp_path / "results.sqlite")


def make_store(path):
    """The fixture store at `path`: a CPU correctness run, two synthetic GPU runs, an interrupted run and a
    training run."""
    cpu = StoredRun(
        RunInfo(
            "2026-01-01T00:00:00Z",
            "",
            "0" * 40,
            True,
            "cpu",
            "cpu",
            "cpu-interpreter",
            "2.13.0",
            "3.9.0",
            "3.11",
            "fixture",
            "none",
        ),
        correctness=[
            CorrectnessRow("rms_norm", "npow2", "bf16", True, None, 1e-3, 1e-3, 4e-3, 2e-3, 2e-3, 5e-3, 0.4),
            CorrectnessRow("softmax", "wide", "fp32", False, None, 9e-6, 1e-7, 5e-7, None, None, None, 1.2),
        ],
    )
    with ResultStore(path) as st:
        st.save(cpu)
        st.save(_gpu_run(2, 1.0))
        st.save(_gpu_run(3, 0.9))
        st.begin_run(_gpu_run(4, 5.0).info)  # interrupted: never finished, left out of every chart
    _training_run(path)
    return path


def _training_run(path) -> None:
    """A `wavefront train --compare` run as the harness stores it (synthetic fixture values)."""
    from wavefront.workbench.distributed.train.store import write_variant

    for variant, loss0 in (("baseline", 5.0), ("wavefront", 5.0)):
        steps = [
            {
                "step": i,
                "loss": loss0 - 0.3 * i,
                "step_s": 0.5,
                "fwd_s": 0.2,
                "bwd_s": 0.25,
                "comm_s": 0.0,
                "opt_s": 0.05,
                "tokens_per_s": 1000.0,
                "mfu": 0.01,
                "measured": i > 0,
            }
            for i in range(5)
        ]
        write_variant(
            path,
            run_id="fixture-train",
            variant=variant,
            status="ok",
            provenance={
                "started_at": "2026-01-04T00:00:00Z",
                "backend": "cpu-interpreter",
                "device_name": "cpu",
                "world_size": 2,
                "parallel": "ddp",
            },
            config={"model": "tiny-llama", "seq_len": 64, "global_batch": 4},
            summary={"tokens_per_s": 1000.0, "mfu": 0.01, "final_loss": steps[-1]["loss"]},
            steps=steps,
        )


@pytest.fixture
def inspect_doc(tmp_path):
    import json

    path = tmp_path / "inspect.json"
    path.write_text(json.dumps(inspect_document()))
    return path


@pytest.fixture
def traffic_doc(tmp_path):
    import json

    path = tmp_path / "traffic.json"
    path.write_text(json.dumps(traffic_document()))
    return path
