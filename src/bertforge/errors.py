"""User-facing errors: the CLI prints these as one line and exits non-zero, without a traceback."""


class BertforgeError(Exception):
    """A problem with the user's input (file, field, config), not a bug in bertforge."""


class ArgumentError(BertforgeError, ValueError, TypeError):
    """An argument of a public function of the wrong type or out of its bounds, named in one line (`batch_size='32':
    expected a whole number at least 1`), raised before any work. A ValueError and a TypeError, so code that
    catches either for a bad argument catches it.

    `param` / `value` / `problem` (from `about`) let the command line say the same of the flag it came from
    (`as_flag`: `--batch-size 0: ...`); `flag_message` is that line for a message about several parameters."""

    def __init__(self, message: str, *, param: str | None = None, value: object = None, problem: str = "",
                 flag_message: str | None = None):
        super().__init__(message)
        self.param, self.value, self.problem, self.flag_message = param, value, problem, flag_message

    @classmethod
    def about(cls, param: str, value: object, problem: str, shown: str | None = None) -> "ArgumentError":
        """`param=VALUE: problem` (VALUE as `shown`, default its repr)."""
        return cls(f"{param}={shown if shown is not None else repr(value)}: {problem}", param=param, value=value,
                   problem=problem)

    def as_flag(self) -> str:
        """The message as the command line says it, naming the flag."""
        if self.flag_message is not None:
            return self.flag_message
        if self.param is None:
            return str(self)
        return f"--{self.param.replace('_', '-')} {self.value}: {self.problem}"
