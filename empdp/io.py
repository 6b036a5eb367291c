"""Atomic, owner-only output files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import hmac
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
