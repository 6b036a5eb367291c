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
from pathlib import Path

from .errors import InputError

KEY_ENV = "EMPDP_KEY"
MIN_KEY_BYTES = 16
_HOW = f"give --key-file FILE or set ${KEY_ENV}"


def load_key(path: str | os.PathLike | None = None) -> bytes | None:
    """The curator key from ``path`` (its stripped bytes), else ``$EMPDP_KEY``, else None.

    Raises
    ------
    InputError
        When the file cannot be read or the key is shorter than 16 bytes.
    """
    if path is not None:
        if not str(path).strip():
            raise InputError(f"--key-file is empty; {_HOW}")
        try:
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise InputError(f"cannot read the key file {str(path)!r}: {exc.strerror or exc}") from None
        where = f"the key file {str(path)!r}"
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
