"""What a release was computed from: the SHA-256 digest of a source's bytes (docs/release-security.md).

The ledger records it beside each release, so a release is tied to the data
it came from; anyone holding the files can check it with ``sha256sum``.

- one file (also ``FILE.duckdb::TABLE``: the DuckDB file): ``sha256:`` and
  the file's SHA-256, as ``sha256sum FILE`` prints it;
- several files (a glob, a folder): ``sha256-files:`` and the SHA-256 of
  their SHA-256 digests, sorted, one per line, each line ending in a newline
  (``sha256sum FILES | cut -d' ' -f1 | sort | sha256sum``);
- an in-memory frame (Python API): ``sha256-arrow:`` and the SHA-256 of its
  Arrow IPC stream;
- a Spark catalog table cannot be read as bytes: ``spark-table:NAME``, not a
  digest, and says so.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path
from typing import Any

from .errors import InputError

#: what the ledger records when the caller gave the value itself (``release --value``)
VALUE_GIVEN = "value given"
_CHUNK = 1 << 20


def source_digest(source: Any = None, table: str | None = None) -> str:
    """The digest of ``source`` (a path, glob, folder, ``FILE.duckdb::TABLE`` or a frame), or of a Spark
    catalog ``table``'s name; :data:`VALUE_GIVEN` when neither is given.

    Raises
    ------
    InputError
        When a file of the source cannot be read, or a glob matches nothing.
    """
    if source is None:
        return f"spark-table:{table}" if table else VALUE_GIVEN
    if isinstance(source, (str, os.PathLike)):
        files = source_files(os.fspath(source))
        digests = sorted(_file_sha256(f) for f in files)
        if len(digests) == 1:
            return "sha256:" + digests[0]
        return "sha256-files:" + hashlib.sha256("".join(d + "\n" for d in digests).encode()).hexdigest()
    return "sha256-arrow:" + _frame_sha256(source)


def source_stamp(source: Any = None) -> list[tuple] | None:
    """Each file of a path source with its size and modification time (None for other sources): taken
    before and after a value is computed, a difference means the data changed while they were read."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    stamps = []
    for f in source_files(os.fspath(source)):
        try:
            st = os.stat(f)
        except OSError:
            stamps.append((f, None, None))
            continue
        stamps.append((f, st.st_size, st.st_mtime_ns))
    return stamps


def source_files(path: str) -> list[str]:
    """The files a path source reads, sorted: the DuckDB file of ``FILE::TABLE``, a folder's files (not
    hidden ones), a glob's matches, or the file itself."""
    if "::" in path:
        path = path.rsplit("::", 1)[0]
    if os.path.isdir(path):
        files = [str(p) for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith(".")]
    elif any(ch in path for ch in "*?["):
        files = [p for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
    else:
        files = [path]
    if not files:
        raise InputError(f"no file matches the source {path[:200]!r}")
    return sorted(files)


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {path[:200]!r} to record its digest: {exc.strerror or exc}") from None
    return h.hexdigest()


def _frame_sha256(frame: Any) -> str:
    """SHA-256 of a pandas/polars/Arrow frame (or DuckDB relation) as an Arrow IPC stream."""
    import pyarrow as pa

    mod = type(frame).__module__.split(".")[0]
    if mod == "duckdb":
        frame = frame.arrow()
    if mod == "polars":
        frame = frame.to_arrow()
    elif mod == "pandas":
        frame = pa.Table.from_pandas(frame, preserve_index=False)
    if hasattr(frame, "read_all"):
        frame = frame.read_all()
    if not isinstance(frame, pa.Table):
        raise InputError(f"cannot record the digest of a source of type {type(frame).__name__}")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, frame.schema) as writer:
        writer.write_table(frame)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()
