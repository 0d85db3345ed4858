"""The project's own exception types; the CLI turns each into a one-line message (exit 2)."""
from __future__ import annotations


class OctoPipeError(Exception):
    """Base of every error OctoPipe raises on purpose."""


class ConfigError(OctoPipeError, ValueError):
    """A preset, override or input file holds an impossible value; the message names the field."""


class ScheduleError(OctoPipeError, ValueError):
    """A schedule table is invalid or a generator was asked for an impossible shape."""


class DeadlockError(OctoPipeError, RuntimeError):
    """A table cannot make progress under the chosen communication semantics."""


class InfeasibleError(OctoPipeError, RuntimeError):
    """No plan fits the devices (memory) or satisfies the constraints."""


class SolverUnavailableError(OctoPipeError, RuntimeError):
    """A requested solver backend is not installed."""


class RuntimeExecutionError(OctoPipeError, RuntimeError):
    """A rank of the torch.distributed runtime failed or stalled."""


class TrainingDiverged(OctoPipeError, RuntimeError):
    """A training run met a non-finite loss or gradient and stopped before updating on it."""


class Terminated(BaseException):
    """The process was asked to stop by a signal (SIGTERM, SIGHUP); raised by the CLI's handler so
    that every `finally` (ranks stopped, temporary files removed) runs on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
