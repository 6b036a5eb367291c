"""Atomic, owner-only output files, checked before any work and committed together."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import hmac
import os
import tempfile
from pathlib import Path


#: the targets and temporary files of the enclosing :func:`output_batch`, if any
_BATCH: contextvars.ContextVar[dict | None] = contextvars.ContextVar("empdp_output_batch", default=None)


def check_output_path(path: str | os.PathLike, what: str = "output") -> None:
    """Refuse, before any work, an output ``path`` that cannot be written.

    Its folder must exist and accept new files (tried by creating and removing
    one) and ``path`` must not be a folder. ``what`` names the option in the
    one-line :class:`~empdp.errors.InputError`.
    """
    os.unlink(_temp_beside(Path(path), what, ".probe"))


def _temp_beside(path: Path, what: str, suffix: str) -> str:
    """A new empty file in the folder of ``path``, or an :class:`InputError` saying why there can be none."""
    from .errors import InputError

    folder = path.parent
    if path.is_dir():
        raise InputError(f"{what} {str(path)!r} is an existing folder; give a file path (inside it, or instead)")
    if not folder.is_dir():
        if folder.exists():
            raise InputError(f"{what} {str(path)!r}: {str(folder)!r} is a file, not a folder; choose another path")
        raise InputError(f"{what} {str(path)!r}: output folder {str(folder)!r} does not exist; create it first")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=folder)
    except OSError as exc:
        raise InputError(f"{what} {str(path)!r}: cannot create files in the folder {str(folder)!r} "
                         f"({exc.strerror or exc}); choose a writable folder") from None
    os.close(fd)
    return tmp


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, private: bool = False):
    """Yield a temporary path beside ``path``; rename it over ``path`` on success.

    Nothing is left behind if the body raises. With ``private`` the file is
    created with mode 0600 (per-individual outputs are sensitive, SPEC 8).
    Inside :func:`output_batch` the rename waits for the batch to commit.
    """
    path = Path(path)
    tmp = _temp_beside(path, "output", ".tmp")
    batch = _BATCH.get()
    try:
        os.chmod(tmp, 0o600 if private else 0o644)
        yield Path(tmp)
        os.chmod(tmp, 0o600 if private else 0o644)
        if batch is None:
            os.replace(tmp, path)
        else:
            earlier = batch.pop(os.path.abspath(path), None)  # written twice: the last one counts
            if earlier:
                os.unlink(earlier)
            batch[os.path.abspath(path)] = tmp
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def output_batch():
    """Commit the outputs written with :func:`atomic_path` inside the block together.

    Each is written to a temporary file beside it; only when the whole block
    succeeds are they renamed into place, so a failure while writing any of
    them leaves none of the new files (and no temporaries). A failed rename
    undoes the renames before it. Nested batches join the outermost one.
    """
    if _BATCH.get() is not None:
        yield
        return
    staged: dict[str, str] = {}
    token = _BATCH.set(staged)
    try:
        yield
    except BaseException:
        _discard(staged.values())
        raise
    finally:
        _BATCH.reset(token)
    _commit(staged)


def _discard(paths) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _commit(staged: dict[str, str]) -> None:
    """Rename every temporary over its target; on failure restore the targets already replaced."""
    done: list[tuple[str, str | None, bool]] = []  # target, hard-link backup of its old file, existed
    try:
        for target, tmp in staged.items():
            existed, backup = os.path.lexists(target), None
            if existed:
                backup = tmp + ".old"
                try:
                    os.link(target, backup)
                except OSError:  # no hard links here: the old file cannot be restored
                    backup = None
            done.append((target, backup, existed))
            os.replace(tmp, target)
    except BaseException:
        for target, backup, existed in reversed(done):
            with contextlib.suppress(OSError):
                if backup:
                    os.replace(backup, target)
                elif not existed:
                    os.unlink(target)
        _discard(staged.values())
        raise
    finally:
        _discard(backup for _, backup, _ in done if backup)


def write_text(path: str | os.PathLike, text: str, private: bool = False) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path, private=private) as tmp:
        tmp.write_text(text, encoding="utf-8")


HASH_KEY_ENV = "EMPDP_HASH_KEY"


def keyed_hash(value, key: bytes) -> str:
    """HMAC-SHA256 of ``str(value)`` under ``key``, first 16 hex digits (a stable pseudonym)."""
    return hmac.new(key, str(value).encode("utf-8"), hashlib.sha256).hexdigest()[:16]


def load_hash_key(path: str | None = None) -> bytes:
    """The id-hashing key: the bytes of ``path`` (stripped), else ``$EMPDP_HASH_KEY``."""
    from .errors import InputError

    if path:
        try:
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise InputError(f"cannot read the hash key file {path!r}: {exc.strerror}") from None
    else:
        key = os.environ.get(HASH_KEY_ENV, "").encode("utf-8")
    if len(key) < 16:
        raise InputError(f"--hash-ids needs a secret key of at least 16 bytes: give --hash-key-file FILE "
                         f"or set {HASH_KEY_ENV}")
    return key


def read_json(path: str | os.PathLike, what: str, hint: str = ""):
    """Parse a JSON file, raising :class:`InputError` naming ``what`` it should be."""
    from .errors import InputError

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{what} {str(path)!r} does not exist{hint}") from None
    except IsADirectoryError:
        raise InputError(f"{what} {str(path)!r} is a folder, not a JSON file{hint}") from None
    except OSError as exc:  # permission denied, a broken device, ...
        raise InputError(f"{what} {str(path)!r} cannot be read: {exc.strerror or exc}; "
                         "check that it is a readable file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {str(path)!r} is not valid JSON: {exc}") from None
