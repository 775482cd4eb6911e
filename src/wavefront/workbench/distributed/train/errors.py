"""The training harness's two errors and its exit codes, in a module that imports nothing of the harness, so
every other module (config, mesh, the parallel dimensions, the loop) can raise them without importing each
other."""

from __future__ import annotations

EXIT_FAILED, EXIT_CONFIG, EXIT_NONFINITE, EXIT_INTERRUPTED = 1, 2, 3, 4


class ConfigError(ValueError):
    """A configuration that cannot run; raised before any work starts."""


class TrainFailure(RuntimeError):
    """The run stopped; ``exit_code`` and a one-line message for the CLI."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code
