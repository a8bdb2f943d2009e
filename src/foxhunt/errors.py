"""Errors a user can fix: one clear line, printed by the CLI, exit code 2.

One base serves foxhunt and its serving core: foxhunt_serve's `InputError`, here also named
`FoxhuntError`, which the commands catch. Its kinds are separate classes, so that an `except`
takes only the kind it means (a book or a strategy that cannot be had on the data is skipped;
a bad config value, an unreadable checkpoint or a failed write surfaces):

- DataError (foxhunt_serve's): the data cannot be used as configured (missing column, NaN,
  order); what the serving core raises about a file reaches foxhunt's commands as it is;
- WriteError (foxhunt_serve's): a result file could not be written;
- ConfigError: the composed configuration is inconsistent (with itself, or with the data);
- CheckpointError: a checkpoint is missing, unreadable or does not match the data."""

from __future__ import annotations

from foxhunt_serve import DataError, InputError, WriteError

FoxhuntError = InputError  # the base: any of them


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
