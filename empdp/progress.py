"""The progress callback every long computation takes: ``progress(stage, done, total)``.

Libraries call it after work (``done`` of ``total`` items of ``stage``; ``total <= 0`` when the
size is not known yet); the CLI draws bars and logs stages from it (``cli/_common.py``).
"""

from __future__ import annotations

from typing import Callable

Progress = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    """The callback that reports nothing (the library's default)."""
    return None


#: the stage of reading the table and computing every individual's leave-one-out shifts
READING = "reading and leave-one-out"
