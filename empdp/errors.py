"""Exceptions that the CLI turns into one-line messages and exit codes."""


class EmpdpError(Exception):
    """Base class of empdp's expected errors (no traceback shown by the CLI)."""

    exit_code = 1


class InputError(EmpdpError, ValueError):
    """Bad input: the message says what is wrong, where, and how to fix it (exit 2)."""

    exit_code = 2


class BudgetExceededError(EmpdpError):
    """A release would exceed the ledger's total-ε budget (exit 1)."""

    exit_code = 1
