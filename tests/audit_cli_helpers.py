"""The audit tests' thin wrapper over :mod:`helpers`: ``run("mpl", ...)`` is ``empdp audit mpl ...``."""

import helpers


def run(*args, env: dict | None = None):
    """``empdp audit ARGS...`` in-process (arguments may be numbers or paths)."""
    return helpers.run("audit", *args, env=env)
