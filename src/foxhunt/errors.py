"""Errors a user can fix: one clear line, printed by the CLI, exit code 2."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from foxhunt_serve.errors import InputError


class FoxhuntError(Exception):
    """A problem with the user's input or configuration, reported as one line."""


class DataError(FoxhuntError):
    """The data cannot be used as configured (missing file/column, NaN, order, length)."""


class ConfigError(FoxhuntError):
    """The composed configuration is inconsistent."""


class CheckpointError(FoxhuntError):
    """A checkpoint is missing, unreadable or does not match the data."""


class WriteError(FoxhuntError):
    """A result file could not be written (the path and the OS error say why)."""


@contextlib.contextmanager
def data_errors() -> Iterator[None]:
    """The serving core's InputError (foxhunt_serve, which knows nothing of foxhunt) as the
    DataError it is here, with the same line."""
    try:
        yield
    except InputError as exc:
        raise DataError(str(exc)) from None
