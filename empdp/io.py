"""Atomic, owner-only output files."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, private: bool = False):
    """Yield a temporary path beside ``path``; rename it over ``path`` on success.

    Nothing is left behind if the body raises. With ``private`` the file is
    created with mode 0600 (per-individual outputs are sensitive, SPEC 8).
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        from .errors import InputError

        raise InputError(f"output folder {str(directory)!r} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        os.chmod(tmp, 0o600 if private else 0o644)
        yield Path(tmp)
        os.chmod(tmp, 0o600 if private else 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str, private: bool = False) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path, private=private) as tmp:
        tmp.write_text(text, encoding="utf-8")
