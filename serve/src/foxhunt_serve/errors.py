"""The errors of the serving core, and of foxhunt above it: each a problem the user can fix,
said in one line (exit code 2). `InputError` is their base, which the commands catch; its kinds
say what is wrong, so that code which passes over one kind (a data problem: no strategy) does
not swallow another. foxhunt re-exports these and adds its own kinds (`foxhunt.errors`:
ConfigError, CheckpointError). A problem of no kind (a bad command-line argument, an export
that disagrees with itself) is the base."""


class InputError(Exception):
    """Bad input of any kind: one line, exit code 2."""


class DataError(InputError):
    """The data cannot be used as given (a missing column, NaN, rows out of order)."""


class WriteError(InputError):
    """A result file could not be written (the path and the OS error say why)."""
