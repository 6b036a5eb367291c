"""Ctrl-C in the worker processes' fork server: ignored from its first import on.

A terminal's Ctrl-C reaches every process of its group: the command, the fork server that starts the
worker processes (:mod:`empdp.assessment.parallel`) and the workers. The command stops with
"interrupted" and shuts its workers down; a fork server still importing, or a worker, used to print a
traceback of its own. The fork server imports this module first (its preload list), so SIGINT is
ignored there before the long imports, and the workers it forks keep that disposition (the server
hands them the handlers it found). Imported anywhere else, it does nothing.
"""

import signal
import sys

if any("multiprocessing.forkserver" in arg for arg in getattr(sys, "orig_argv", ())):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
