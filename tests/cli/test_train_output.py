"""`wavefront train --compare` on a CPU leads with the loss agreement (the one result that means something
there) and marks the wall-time ratios as not performance; a time estimate follows each variant's first
step. The harness is replaced by a recorded result, so this runs in a second."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from wavefront.cli import train as cli_train
from wavefront.cli.train import ROWS
from wavefront.workbench.distributed.train.readout import estimate_line, estimate_step

pytest.importorskip("transformers")


def _summary(step_s: float, loss: float) -> SimpleNamespace:
    s = SimpleNamespace(**{key: None for _, key, _, _ in ROWS})
    s.step_s_mean, s.tokens_per_s, s.final_loss, s.peak_mem_bytes, s.comm_by_dim = step_s, 32 / step_s, loss, 5e8, {}
    s.peak = SimpleNamespace(source="measured")
    s.peak_mem_kind, s.price_source, s.energy_kind, s.notes, s.prediction = "rss", "none", "none", [], None
    return s


def _result(backend: str) -> SimpleNamespace:
    steps = [SimpleNamespace(step=i) for i in range(3)]
    variants = [SimpleNamespace(variant=name, summary=_summary(t, 4.83552), notes=[], trace_paths=[], patch_report=None,
                                resumed_from_step=None, steps=steps)
                for name, t in (("baseline", 0.85), ("wavefront", 24.65))]
    return SimpleNamespace(
        run_id="r1", config={"model": "tiny-llama"}, store=None, variants=variants,
        provenance={"parallel": "single", "world_size": 1, "device_name": "cpu", "backend": backend},
        comparisons={"wavefront": {"tokens_per_s_ratio": 0.0345, "step_s_ratio": 28.95, "peak_mem_ratio": 1.01,
                                   "max_abs_loss_diff": 2.38e-07, "final_loss_diff": 0.0}})


def _render(renderable, width: int = 120) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def test_cpu_table_marks_timing_ratios_and_shows_the_loss_difference():
    text = _render(cli_train.kpi_table(_result("cpu-interpreter")))
    assert "28.950" not in text and "0.035" not in text  # no step-time ratio presented as a finding
    assert len(re.findall(r"not perf(?!ormance)", text)) == 2  # tokens/s and step time ratios
    assert "CPU: times are correctness runs, not performance" in " ".join(text.split())
    assert any("max |loss difference|" in ln and "2.38e-07" in ln for ln in text.splitlines())
    gpu = _render(cli_train.kpi_table(_result("cuda")))
    assert "28.950" in gpu and "not perf" not in gpu


def test_cpu_compare_leads_with_the_loss_agreement(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from wavefront.cli import build_app
    from wavefront.workbench.distributed.train import harness

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)

    def fake_run(cfg, on_step):
        for name, t in (("baseline", 0.85), ("wavefront", 24.65)):
            for i in range(cfg.steps):
                on_step(name, SimpleNamespace(step=i, step_s=t, loss=4.8, tokens_per_s=32 / t,
                                                 token_accuracy=None), cfg.steps)
        return _result("cpu-interpreter")

    monkeypatch.setattr(harness, "run", fake_run)
    monkeypatch.setattr(harness, "shutdown", lambda failed: None)
    r = CliRunner().invoke(build_app(), ["train", "--compare", "--steps", "3", "--store", ""])
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert out.startswith("loss agreement, wavefront vs baseline: max |loss difference| 2.38e-07 over 3 steps")
    assert "loss curves:" not in r.stdout  # no longer a footnote
    err = " ".join(r.stderr.split())
    assert "2 variants x 3 steps; an estimate follows each one's step 2" in err
    assert "wavefront: step 2 took 25 s; estimate for its other 1 step: about 25 s" in err
    assert "baseline: step 2 took 1 s; estimate for its other 1 step: about 1 s (then wavefront)" in err


def test_estimate_line_units():
    # Step 2 (the first also pays one-off costs); a 2-step run estimates after its first.
    assert [estimate_step(n) for n in (1, 2, 3, 10)] == [None, 0, 1, 1]
    assert estimate_line("wavefront", 1, 24.65, 10, ("baseline", "wavefront")) == (
        "wavefront: step 2 took 25 s; estimate for its other 8 steps: about 3.3 min")
