"""`wavefront <verb>`: a thin command line over library functions.

Each verb module in :data:`VERB_MODULES` defines ``register(app)``, adding its commands; the modules
parse arguments, call library functions, and print (a rich table, or JSON with ``--json``). Heavy imports
happen inside the commands, so ``wavefront --help`` stays fast.

JSON conventions (every verb): ``--json PATH`` writes the result document to PATH (``-`` for stdout);
every document is an object with ``"schema": "wavefront.<verb>/<version>"`` and the verb's fields,
documented in docs/cli-json.md.
"""

from __future__ import annotations

import importlib
import os

import typer

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
)


def _configure_backend() -> None:
    """On a machine without a GPU, run kernels under the Triton interpreter (set before any kernel
    module is imported). An explicit TRITON_INTERPRET in the environment wins."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def build_app() -> typer.Typer:
    app = typer.Typer(name="wavefront", no_args_is_help=True, add_completion=False,
                      help="Fused Triton kernels for transformer training, and the workbench that proves them.")

    @app.callback()
    def _root() -> None:
        """Fused Triton kernels for transformer training, and the workbench that proves them."""

    for module in VERB_MODULES:
        importlib.import_module(module).register(app)
    return app


#: Verbs that never run a kernel: backend detection (which imports torch, about a second) is skipped.
TORCH_FREE_VERBS: tuple[str, ...] = ("plan",)


def main() -> None:
    import sys

    if not (len(sys.argv) > 1 and sys.argv[1] in TORCH_FREE_VERBS):
        _configure_backend()
    build_app()()
