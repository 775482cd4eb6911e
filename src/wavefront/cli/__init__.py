"""`wavefront <verb>`: a thin command line over library functions.

Each verb module in :data:`VERB_MODULES` defines ``register(app)``, adding its commands; the modules
parse arguments, call library functions, and print (a rich table, or JSON with ``--json``). Heavy imports
happen inside the commands, so ``wavefront --help`` stays fast.

JSON conventions (every verb): ``--json PATH`` writes the result document to PATH (``-`` for stdout);
every document is an object with ``"schema": "wavefront.<verb>/<version>"`` and the verb's fields,
documented in docs/json/<verb>.md.
"""

from __future__ import annotations

import importlib
import os
import sys

try:
    import typer
except ImportError as exc:  # the kernels-only install: `pip install wavefront` has no command line
    raise SystemExit("wavefront: the command line needs the [cli] extra: pip install 'wavefront[cli]' "
                     "(or 'wavefront[workbench]' for every verb)") from exc

# One line per verb module; each owns its verbs.
VERB_MODULES: tuple[str, ...] = (
    "wavefront.cli.bench",
    "wavefront.cli.compare", "wavefront.cli.report", "wavefront.cli.bisect",
    "wavefront.cli.comm",
    "wavefront.cli.plan",
    "wavefront.cli.train",
    "wavefront.cli.trace",
    "wavefront.cli.inspect",
    "wavefront.cli.gate",
    "wavefront.cli.counters",
)


def _configure_backend() -> None:
    """On a machine without a GPU, run kernels under the Triton interpreter (set before any kernel
    module is imported). An explicit TRITON_INTERPRET in the environment wins."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch  # lazy: --help

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def build_app() -> typer.Typer:
    from wavefront.cli._common import VerbGroup  # lazy: --help

    app = typer.Typer(name="wavefront", no_args_is_help=True, add_completion=False, cls=VerbGroup,
                      help="Fused Triton kernels for transformer training, and the workbench that proves them.")

    @app.callback()
    def _root() -> None:
        """Fused Triton kernels for transformer training, and the workbench that proves them."""

    for module in VERB_MODULES:
        importlib.import_module(module).register(app)
    return app


#: Verbs that never run a kernel: no backend detection, which imports torch (about 2 CPU-s and 185 MiB);
#: `wavefront trace analyze` and `wavefront plan` work in an environment without torch.
TORCH_FREE_VERBS: tuple[str, ...] = ("plan", "trace", "counters")


def _needs_backend(argv: list[str]) -> bool:
    """Only a verb that may run a kernel pays for torch: not --help, not the torch-free verbs."""
    verb = next((a for a in argv[1:] if not a.startswith("-")), None)
    return verb is not None and verb not in TORCH_FREE_VERBS


def main() -> None:
    if _needs_backend(sys.argv):
        _configure_backend()
    build_app()()
