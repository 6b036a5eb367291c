"""Exceptions that the CLI turns into one-line messages and exit codes."""


class EmpdpError(Exception):
    """Base class of empdp's expected errors (no traceback shown by the CLI)."""

    exit_code = 1


class InputError(EmpdpError, ValueError):
    """Bad input: the message says what is wrong, where, and how to fix it (exit 2).

    ``param`` names the library parameter(s) the message mentions, each written in backquotes
    (``InputError("`threads` must be ...", param="threads")``): the command line shows their flags
    there instead (``--threads must be ...``).
    """

    exit_code = 2

    def __init__(self, message: str = "", *, param: str | tuple | None = None):
        super().__init__(message)
        self.param = (param,) if isinstance(param, str) else tuple(param or ())

    def shown(self, flag) -> str:
        """The message with each parameter it names shown as ``flag(param)`` shows it."""
        text = str(self)
        for name in self.param:
            text = text.replace(f"`{name}`", flag(name))
        return text


class BudgetExceededError(EmpdpError):
    """A release would exceed the ledger's total-ε budget (exit 1)."""

    exit_code = 1
