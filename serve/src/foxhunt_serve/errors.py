"""The one error of the serving core: bad input, one line, exit code 2."""


class InputError(Exception):
    """A problem with the export or the data: one line, exit code 2."""
