"""Errors a user can fix: one clear line, printed by the CLI, exit code 2.

One class serves foxhunt and its serving core: foxhunt_serve's `InputError`. A data error is
that class itself, so what the serving core raises about a file reaches foxhunt's commands as
it is, with no wrapper; the others are its kinds."""

from __future__ import annotations

from foxhunt_serve import InputError, WriteError

FoxhuntError = InputError  # any of them
DataError = InputError  # the data cannot be used as configured (missing column, NaN, order)


class ConfigError(InputError):
    """The composed configuration is inconsistent."""


class CheckpointError(InputError):
    """A checkpoint is missing, unreadable or does not match the data."""


__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "FoxhuntError",
    "InputError",
    "WriteError",
]
