"""`wavefront predict`: the predicted fraction of peak per kernel, a model read from the static baseline's
machine code and bytes (wavefront.workbench.jobs.predict; the model and its assumptions: docs/predicted-peak.md).
Never a measurement: every row says "predicted"."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from wavefront.cli._common import JsonOut, command, request_errors, write_json
from wavefront.cli._output import console
from wavefront.workbench.jobs import predict as job
from wavefront.workbench.jobs.ops import split_targets

_DEFAULT = job.PredictRequest()


def predict_cmd(
    baseline: Annotated[Path, typer.Option(help="A static baseline document (`wavefront gate --static --update` "
                                                "writes it).")] = Path(_DEFAULT.baseline),
    targets: Annotated[str, typer.Option(help="Comma-separated compile targets.")] = ",".join(_DEFAULT.targets),
    ops: Annotated[str, typer.Option(help="Comma-separated ops (default: every op in the baseline).")] = "",
    all_cases: Annotated[bool, typer.Option("--all", help="Every case, not only the documented Llama-3-8B "
                                                          "ones.")] = False,
    json_out: JsonOut = None,
) -> None:
    """Predicted fraction of peak of every modelled kernel (a model, never measured): memory-bound ops as a
    fraction of HBM bandwidth from their bytes, matrix-unit kernels from a per-iteration cycle model of their
    machine code (wait depth, barriers, mask instructions, occupancy). Bad input exits 2."""
    with request_errors():
        request = job.PredictRequest(baseline=str(baseline), targets=split_targets(targets),
                                     ops=tuple(o for o in ops.split(",") if o))
        report = job.predict(request)
    if json_out != "-":
        console.print(job.markdown(report, cases=() if all_cases else job.DOC_CASES), end="", soft_wrap=True,
                      highlight=False, markup=False)
    if json_out:
        write_json(report.as_dict(), json_out)


def register(app: typer.Typer) -> None:
    command(app, "predict")(predict_cmd)
