"""User-facing errors: the CLI prints these as one line and exits non-zero, without a traceback."""


class BertforgeError(Exception):
    """A problem with the user's input (file, field, config), not a bug in bertforge."""
