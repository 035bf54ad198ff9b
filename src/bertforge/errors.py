"""User-facing errors: the CLI prints these as one line and exits non-zero, without a traceback."""


class BertforgeError(Exception):
    """A problem with the user's input (file, field, config), not a bug in bertforge."""


class ArgumentError(BertforgeError, ValueError, TypeError):
    """An argument of a public function of the wrong type or out of its bounds, named in one line (`batch_size='32':
    expected a whole number at least 1`), raised before any work. A ValueError and a TypeError, so code that
    catches either for a bad argument catches it."""
