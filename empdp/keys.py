"""The curator key: HMAC-SHA256 integrity of calibration files and release ledgers.

The key is read like the ``--hash-ids`` key (:func:`empdp.io.load_hash_key`):
the stripped bytes of ``--key-file FILE``, else ``$EMPDP_KEY``; at least 16
bytes. Files carry the key's *id* (an HMAC of a fixed label, which reveals
nothing about the key) so that "signed with another key" can be told apart
from "edited". See docs/release-security.md for the threat model.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat

from .errors import InputError

KEY_ENV = "EMPDP_KEY"
MIN_KEY_BYTES = 16
_HOW = f"give --key-file FILE or set ${KEY_ENV}"


#: a key file larger than this is not a key (``--key-file /dev/zero`` must not read until memory runs out)
MAX_KEY_FILE_BYTES = 4096


def read_key_file(path: str | os.PathLike, option: str = "--key-file") -> bytes:
    """The stripped bytes of a secret key file, refused unless it is owner-only and small.

    A key readable or writable by group or others is not a secret (or can be
    replaced); a file past :data:`MAX_KEY_FILE_BYTES` (a device, a data file
    named by mistake) is refused after reading at most that many bytes plus one.

    Raises
    ------
    InputError
        One line naming the file and the fix (``chmod 600 FILE``, a shorter file).
    """
    if not str(path).strip():
        raise InputError(f"{option} is empty; {_HOW}")
    name = f"{str(path)!r} ({option})"
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)  # a FIFO must not block: it is refused below
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputError(f"cannot read the key file {name}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"the key file {name} is not a regular file; give the file holding the key")
        if st.st_mode & 0o077:
            raise InputError(f"the key file {name} can be read or changed by other users (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); make it owner-only with 'chmod 600 {path}'")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read the key file {name}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise InputError(f"the key file {name} is larger than {MAX_KEY_FILE_BYTES} bytes, so it is not a key "
                         "file; give the file holding the key (e.g. 'head -c 32 /dev/urandom | base64 > FILE')")
    return data.strip()


def load_key(path: str | os.PathLike | None = None) -> bytes | None:
    """The curator key from ``path`` (:func:`read_key_file`), else ``$EMPDP_KEY``, else None.

    Raises
    ------
    InputError
        When the file cannot be read, is not owner-only or too large, or the
        key is shorter than 16 bytes.
    """
    if path is not None:
        key, where = read_key_file(path), f"the key file {str(path)!r}"
    else:
        env = os.environ.get(KEY_ENV, "")
        if not env:
            return None
        key, where = env.strip().encode("utf-8"), f"${KEY_ENV}"
    if len(key) < MIN_KEY_BYTES:
        raise InputError(f"the curator key in {where} must be at least {MIN_KEY_BYTES} bytes (a random secret, "
                         f"e.g. 'head -c 32 /dev/urandom | base64'); {_HOW}")
    return key


def key_id(key: bytes) -> str:
    """A public 16-hex-digit name of ``key`` (HMAC of a fixed label: reveals nothing about the key)."""
    return hmac.new(key, b"empdp key id", hashlib.sha256).hexdigest()[:16]


def mac(key: bytes | None, text: str) -> str:
    """HMAC-SHA256 of ``text`` under ``key``; without a key the plain SHA-256 (unsigned files only)."""
    if key is None:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def same(a, b) -> bool:
    """Constant-time equality of two hex strings (False if either is not a string)."""
    return isinstance(a, str) and isinstance(b, str) and hmac.compare_digest(a.encode(), b.encode())
