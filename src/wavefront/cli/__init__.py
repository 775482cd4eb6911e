"""`wavefront <verb>`: a thin command line over library functions.

Each verb is a row of :data:`VERBS`: the module that defines it (``register(app)`` adds its commands) and a
one-line summary for ``wavefront --help``. A verb module is imported only when its verb runs or shows its
help, so ``wavefront --help`` imports no verb module, no workbench module and no torch, and each verb
module imports its library code at the top. The modules parse arguments, call library functions, and
print (a rich table, or JSON with ``--json``).

JSON conventions (every verb): ``--json PATH`` writes the result document to PATH (``-`` for stdout);
every document is an object with ``"schema": "wavefront.<verb>/<version>"`` and the verb's fields,
documented in docs/json/<verb>.md.
"""

from __future__ import annotations

import os
import sys

try:
    import typer
except ImportError as exc:  # the kernels-only install: `pip install wavefront` has no command line
    raise SystemExit("wavefront: the command line needs the [cli] extra: pip install 'wavefront[cli]' "
                     "(or 'wavefront[workbench]' for every verb)") from exc

from wavefront.cli._help import LazyVerbGroup, Verb

#: Every verb, in the order `wavefront --help` lists them. torch_free: the verb never runs a kernel, so no
#: backend detection, which imports torch (about 2 CPU-s and 185 MiB); `wavefront trace analyze` and
#: `wavefront plan` work in an environment without torch.
VERBS: dict[str, Verb] = {
    "bench": Verb("wavefront.cli.bench", "Every op against its float64 reference, timed, counted, stored."),
    "compare": Verb("wavefront.cli.compare", "Speedup of run B over run A per case, with a verdict."),
    "report": Verb("wavefront.cli.report", "Write the HTML dashboard from the store and JSON documents."),
    "bisect": Verb("wavefront.cli.bisect", "Find the commit where a case became slower."),
    "comm": Verb("wavefront.cli.comm", "Benchmark collectives and fit their cost for the planner."),
    "overlap": Verb("wavefront.cli.comm", "Exposed communication beside compute; DDP bucket caps."),
    "plan": Verb("wavefront.cli.plan", "Rank the parallel plans of a model on a cluster.", torch_free=True),
    "train": Verb("wavefront.cli.train", "Train on a device mesh; tokens/s, MFU, memory, $ per step."),
    "inspect": Verb("wavefront.cli.inspect", "Machine code of every kernel for six GPU targets (no GPU)."),
    "traffic": Verb("wavefront.cli.inspect", "Bytes each kernel moves, against the op's minimum."),
    "roofline": Verb("wavefront.cli.inspect", "Each bench case on a device's roofline."),
    "predict": Verb("wavefront.cli.predict", "Predicted fraction of peak per kernel (a model, not measured)."),
    "gate": Verb("wavefront.cli.gate", "Fail on a static (machine code, bytes) or perf regression."),
    "counters": Verb("wavefront.cli.counters", "Hardware counters of a vendor profile on the roofline.",
                     torch_free=True),
    "trace": Verb("wavefront.cli.trace", "Profiler traces (torch, jax, nsys, rocprofv3): breakdown, diff.",
                  torch_free=True),
}

#: The verbs that never pay for torch (their rows say torch_free).
TORCH_FREE_VERBS: tuple[str, ...] = tuple(name for name, verb in VERBS.items() if verb.torch_free)


class _Root(LazyVerbGroup):
    verbs = VERBS


def _configure_backend() -> None:
    """On a machine without a GPU, run kernels under the Triton interpreter (set before any kernel
    module is imported). An explicit TRITON_INTERPRET in the environment wins."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch  # lazy: --help

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def build_app() -> typer.Typer:
    app = typer.Typer(name="wavefront", no_args_is_help=True, add_completion=False, cls=_Root,
                      help="Fused Triton kernels for transformer training, and the workbench that proves them.")

    @app.callback()
    def _root() -> None:
        """Fused Triton kernels for transformer training, and the workbench that proves them."""

    return app


def _needs_backend(argv: list[str]) -> bool:
    """Only a verb that may run a kernel pays for torch: not --help, not the torch-free verbs."""
    verb = next((a for a in argv[1:] if not a.startswith("-")), None)
    return verb is not None and verb not in TORCH_FREE_VERBS


def main() -> None:
    if _needs_backend(sys.argv):
        _configure_backend()
    build_app()()
