"""The one error of the serving core, and of foxhunt above it: bad input, one line, exit code
2 (foxhunt's DataError is this class; its other errors are its kinds)."""


class InputError(Exception):
    """A problem with the export or the data: one line, exit code 2."""


class WriteError(InputError):
    """A result file could not be written (the path and the OS error say why)."""
