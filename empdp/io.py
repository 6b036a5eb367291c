"""Atomic, owner-only output files, checked before any work and committed together."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import json
import math
import os
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

from .errors import InputError
from .keys import read_key_file

#: the targets and temporary files of the enclosing :func:`output_batch`, if any
_BATCH: contextvars.ContextVar[dict | None] = contextvars.ContextVar("empdp_output_batch", default=None)


def check_output_path(path: str | os.PathLike, what: str = "output") -> None:
    """Refuse, before any work, an output ``path`` that cannot be written.

    Its folder must exist and accept new files (tried by creating and removing
    one), its name must fit the file system, and ``path`` must not be a folder.
    ``what`` names the option in the one-line :class:`~empdp.errors.InputError`.
    """
    os.unlink(_temp_beside(Path(path), what, ".probe"))


def _shorten(value, width: int = 80) -> str:
    from .data import shorten

    return shorten(value, width)


def _clip(text: str, width: int) -> str:
    from .data import clip

    return clip(text, width)


#: longest part of the target's name kept in its temporary's name (which adds ~15 characters)
_TEMP_NAME = 200
#: temporaries of a target older than this are left over from a killed run and removed
STALE_SECONDS = 3600


def _temp_prefix(path: Path) -> str:
    return f".{path.name[:_TEMP_NAME]}."


def _require_short_name(path: Path, what: str) -> None:
    """An :class:`InputError` if the file name or the whole path is longer than the system allows."""
    folder = path.parent
    try:
        name_max = os.pathconf(folder if folder.is_dir() else ".", "PC_NAME_MAX")
        path_max = os.pathconf(folder if folder.is_dir() else ".", "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    if len(os.fsencode(path.name)) > name_max:
        raise InputError(f"{what} {_shorten(str(path))}: the file name is {len(os.fsencode(path.name))} bytes "
                         f"long, over the {name_max} this file system allows; choose a shorter name")
    if len(os.fsencode(os.path.abspath(path))) >= path_max:
        raise InputError(f"{what} {_shorten(str(path))}: the path is over the {path_max} bytes this system "
                         f"allows; choose a shorter path")


def _temp_beside(path: Path, what: str, suffix: str) -> str:
    """A new empty file in the folder of ``path``, or an :class:`InputError` saying why there can be none."""
    shown = _shorten(str(path))
    _require_short_name(path, what)
    folder = path.parent
    try:
        is_dir, folder_is_dir, folder_exists = path.is_dir(), folder.is_dir(), folder.exists()
    except OSError as exc:  # a path through a file, a loop of links, ...
        raise InputError(f"{what} {shown}: {exc.strerror or exc}; choose another path") from None
    if is_dir:
        raise InputError(f"{what} {shown} is an existing folder; give a file path (inside it, or instead)")
    if not folder_is_dir:
        if folder_exists:
            raise InputError(f"{what} {shown}: {_shorten(str(folder))} is a file, not a folder; choose another path")
        raise InputError(f"{what} {shown}: output folder {_shorten(str(folder))} does not exist; create it first")
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=suffix, dir=folder)
    except OSError as exc:
        raise InputError(f"{what} {shown}: cannot create files in the folder {_shorten(str(folder))} "
                         f"({exc.strerror or exc}); choose a writable folder") from None
    os.close(fd)
    return tmp


def remove_stale_temporaries(path: str | os.PathLike, older_than: float = STALE_SECONDS) -> list[str]:
    """Remove the temporaries of ``path`` left by a killed run; return their paths.

    Only regular files of this user named like the temporaries of ``path``
    (``.NAME.XXXXXXXX.tmp``, ``.tmp.old`` or ``.probe``) and not modified for
    ``older_than`` seconds are removed: a run still writing them is never touched.
    """
    import re
    import stat
    import time

    path = Path(path)
    pattern = re.compile(re.escape(_temp_prefix(path)) + r"[A-Za-z0-9_]{8}(?:\.tmp|\.tmp\.old|\.probe)")
    now, removed = time.time(), []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        if not pattern.fullmatch(name):
            continue
        full = os.path.join(path.parent, name)
        try:
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and now - st.st_mtime > older_than:
                os.unlink(full)
                removed.append(full)
        except OSError:
            continue
    return removed


def refuse_overwrite(out_path: str | os.PathLike | None, *input_paths, option: str = "--out") -> None:
    """Refuse an output path that is one of the inputs (or inside an input folder).

    ``input_paths`` are the command's input files, globs, folders or
    ``FILE.duckdb::TABLE`` sources; anything else (a data frame, None) is skipped.
    Links are resolved, so a symbolic or hard link to an input is refused too.
    Raises :class:`~empdp.errors.InputError` naming ``option``.
    """
    import glob

    if out_path is None:
        return
    out = os.fspath(out_path)
    real_out = os.path.realpath(out)
    for source in input_paths:
        if not isinstance(source, (str, os.PathLike)):
            continue
        source = os.fspath(source)
        if "::" in source and not os.path.exists(source):
            source = source.rsplit("::", 1)[0]
        candidates = glob.glob(source, recursive=True) if any(c in source for c in "*?[") else [source]
        for inp in candidates:
            real_in = os.path.realpath(inp)
            same = real_in == real_out
            if not same and os.path.exists(out) and os.path.exists(inp) and not os.path.isdir(inp):
                try:
                    same = os.path.samefile(out, inp)
                except OSError:
                    same = False
            if same:
                raise InputError(f"{option} {_shorten(out)} is the input {_shorten(inp)}: writing it would "
                                 f"destroy the input; choose another output file")
            if os.path.isdir(inp) and os.path.commonpath([real_in, real_out]) == real_in:
                raise InputError(f"{option} {_shorten(out)} is inside the input folder {_shorten(inp)}: the "
                                 f"next read of the folder would include it; write it elsewhere")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, private: bool = False):
    """Yield a temporary path beside ``path``; rename it over ``path`` on success.

    Nothing is left behind if the body raises, and temporaries of ``path`` that
    a killed run left (over an hour old) are removed. With ``private`` the file
    is created with mode 0600 (per-individual outputs are sensitive); otherwise
    a file it replaces keeps its mode. Inside :func:`output_batch` the rename
    waits for the batch to commit.
    """
    path = Path(path)
    tmp = _temp_beside(path, "output", ".tmp")
    remove_stale_temporaries(path)
    mode = _mode(path, private)
    batch = _BATCH.get()
    try:
        os.chmod(tmp, mode)
        yield Path(tmp)
        os.chmod(tmp, mode)
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


def _mode(path: Path, private: bool) -> int:
    """0600 for private files; otherwise the mode of the file replaced, or 0644 for a new one."""
    if private:
        return 0o600
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        return 0o644


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
    if path:
        key = read_key_file(path, "--hash-key-file")  # owner-only and small, like the curator key
    else:
        key = os.environ.get(HASH_KEY_ENV, "").encode("utf-8")
    if len(key) < 16:
        raise InputError(f"`hash_ids` needs a secret key of at least 16 bytes: give `hash_key_file` FILE "
                         f"or set {HASH_KEY_ENV}", param=("hash_ids", "hash_key_file"))
    return key


#: integers with more digits are read as floats (inf beyond a double), as 1e400 is: the
#: checks of each file refuse them by name; Python refuses to convert over 4300 digits
_MAX_DIGITS = 308


def jsonable(value):
    """``value`` as strict JSON holds it: numpy scalars and arrays as Python numbers and lists, bools as
    bools, non-finite numbers as null, keys as text, and any other scalar (a date, a decimal id) as its
    text. The one JSON cleaner of every output: terminal ``--json``, result files and the report."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # a numpy array or scalar (numpy is not imported for this)
        return jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value if value is None or isinstance(value, (bool, int, str)) else str(value)


def _json_int(text: str) -> int | float:
    return int(text) if len(text) <= _MAX_DIGITS else float(text)


def read_json(path: str | os.PathLike, what: str, hint: str = ""):
    """Parse a JSON file, raising :class:`InputError` naming ``what`` it should be.

    Integers of more than 308 digits are read as floats (like 1e400), for the
    callers' checks to refuse by name; nesting deeper than Python can parse is
    refused here, in one line (never an internal error).
    """
    shown = _shorten(str(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text, parse_int=_json_int)
    except FileNotFoundError:
        raise InputError(f"{what} {shown} does not exist{hint}") from None
    except IsADirectoryError:
        raise InputError(f"{what} {shown} is a folder, not a JSON file{hint}") from None
    except OSError as exc:  # permission denied, a broken device, ...
        raise InputError(f"{what} {shown} cannot be read: {exc.strerror or exc}; "
                         "check that it is a readable file") from None
    except RecursionError:
        raise InputError(f"{what} {shown} nests lists or objects too deeply to read (empdp's files nest "
                         f"a few levels); check that it is the right file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {shown} is not valid JSON: {_clip(exc, 120)}") from None
    except ValueError as exc:  # e.g. Python's limit on the digits of an integer
        raise InputError(f"{what} {shown} cannot be read as JSON: {_clip(exc, 120)}") from None


# ------------------------------------------------------------------ fields of files read back

class Field(ABC):
    """What one field of a JSON file read back must hold (:func:`check_fields`); ``what`` names it
    in the error. Subclasses check one kind; a field the reader never uses has no spec."""

    what = "a value"

    @abstractmethod
    def problem(self, value, path: str) -> tuple[str, str, object] | None:
        """``(path, expected, got)`` of the first value that does not fit, or None."""


class _Leaf(Field):
    """A field of one value (not a container): it fits or it does not."""

    def problem(self, value, path: str) -> tuple[str, str, object] | None:
        return None if self.fits(value) else (path, self.what, value)

    @abstractmethod
    def fits(self, value) -> bool:
        """Whether ``value`` is of this field's kind and range."""


class Num(_Leaf):
    """A number in ``[lo, hi]`` (``gt``: above it); ``integer`` for counts; ``null`` allows null (a
    missing or NaN value); ``inf`` allows ±∞, as a float or the strings "inf"/"-inf" result files write."""

    def __init__(self, lo: float = -math.inf, hi: float = math.inf, *, gt: float | None = None,
                 integer: bool = False, null: bool = False, inf: bool = False):
        self.lo, self.hi, self.gt, self.integer, self.null, self.inf = lo, hi, gt, integer, null, inf
        bounds = f" above {gt:g}" if gt is not None else "" if (lo, hi) == (-math.inf, math.inf) else \
            f" in [{lo:g}, {hi:g}]"
        self.what = f"{'an integer' if integer else 'a number'}{bounds}" + (" or null" if null else "")

    def fits(self, value) -> bool:
        if value is None:
            return self.null
        if self.inf and value in ("inf", "-inf"):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.integer and not isinstance(value, int)):
            return False
        if math.isnan(value):
            return self.null
        if math.isinf(value) and not self.inf:
            return False
        return self.lo <= value <= self.hi and (self.gt is None or value > self.gt)


class Kind(_Leaf):
    """A value of one of the JSON ``types`` (bool is never a number here), or one of ``choices``."""

    def __init__(self, *types: type, choices: tuple = (), what: str = ""):
        self.types, self.choices = types, choices
        self.what = what or (f"one of {', '.join(map(repr, choices))}" if choices else
                             " or ".join("null" if t is type(None) else {str: "text", bool: "true or false"}.get(
                                 t, t.__name__) for t in types))

    def fits(self, value) -> bool:
        if self.choices:
            return any(value == c and type(value) is type(c) for c in self.choices)
        return isinstance(value, self.types) and not (isinstance(value, bool) and bool not in self.types)


TEXT, FLAG = Kind(str), Kind(bool)
#: a label or an id: JSON's scalars
SCALAR = Kind(str, int, float, bool, type(None), what="a text, a number, true, false or null")


class ListOf(Field):
    """A list of items of ``item``, of ``min``–``max`` of them."""

    def __init__(self, item: Field, min: int = 0, max: int | None = None, same_kind: bool = False):
        self.item, self.min, self.max, self.same_kind = item, min, max, same_kind
        self.what = f"a list of {min if max is None else f'{min}-{max}'}{'+' if max is None and min else ''} items" \
            if min or max is not None else "a list"
        if same_kind:  # a column of ids: all texts, or all numbers (nulls aside)
            self.what += " of one kind (all texts or all numbers)"

    def problem(self, value, path: str):
        if not isinstance(value, list) or len(value) < self.min or (self.max is not None and len(value) > self.max):
            return path, self.what, value
        if self.same_kind and len({_kind(v) for v in value if v is not None}) > 1:
            return path, self.what, value
        for k, v in enumerate(value):
            found = self.item.problem(v, f"{path}[{k}]")
            if found:
                return found
        return None


def _kind(v) -> str:
    return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__


class Obj(Field):
    """A JSON object with the ``fields`` (name → spec; None: present, not checked); ``optional``
    names may be missing. Other keys are data the reader never uses, and are left alone."""

    what = "an object"

    def __init__(self, fields: dict, optional: tuple = ()):
        self.fields, self.optional = fields, set(optional)

    def problem(self, value, path: str):
        if not isinstance(value, dict):
            return path, self.what, value
        for name, spec in self.fields.items():
            where = f"{path}.{name}" if path else name
            if name not in value:
                if name in self.optional:
                    continue
                return where, "present", _MISSING
            found = spec.problem(value[name], where) if spec is not None else None
            if found:
                return found
        return None


class MapOf(Field):
    """A JSON object whose keys are the text of integers (JSON's keys of a histogram) and values ``item``."""

    what = "an object of integer keys"

    def __init__(self, item: Field):
        self.item = item

    def problem(self, value, path: str):
        if not isinstance(value, dict) or not all(isinstance(k, str) and k.strip().lstrip("-").isdigit()
                                                  for k in value):
            return path, self.what, value
        for k, v in value.items():
            found = self.item.problem(v, f"{path}.{k}")
            if found:
                return found
        return None


class AnyOf(Field):
    """A value that fits one of ``specs``."""

    def __init__(self, *specs: Field):
        self.specs = specs
        self.what = " or ".join(spec.what for spec in specs)

    def problem(self, value, path: str):
        return None if any(spec.problem(value, path) is None for spec in self.specs) else (path, self.what, value)


_MISSING = object()


def check_fields(doc, schema: Field, what: str, path, hint: str = "") -> None:
    """Refuse a file whose content does not fit ``schema``, in one line naming the file and the first
    field that does not fit, before any of it is used: a file from elsewhere is data, whatever it holds.

    Raises
    ------
    InputError
        Naming ``what`` (the kind of file), ``path`` and the field, e.g. ``result file r.json is
        damaged or incomplete: field 'sweep.delta[3]' must be a number in [0, 1] or null, got 'abc'``,
        then ``hint``.
    """
    found = schema.problem(doc, "")
    if found is None:
        return
    field, expected, got = found
    name = f"field {field!r}" if field else "its content"
    where = f"{what}{'' if path is None else ' ' + _shorten(str(path))} is damaged or incomplete"
    if got is _MISSING:
        raise InputError(f"{where}: {name} is missing{hint}")
    shown = repr(_clip(got, 40)) if isinstance(got, str) else \
        type(got).__name__.replace("NoneType", "null").replace("dict", "an object").replace("list", "a list") \
        if isinstance(got, (dict, list, type(None))) else repr(got)[:40]
    raise InputError(f"{where}: {name} must be {expected}, got {shown}{hint}")


#: first characters with which a spreadsheet reads a cell as a formula (or, tab and CR, shifts it)
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_neutral(df):
    """``df`` (a polars frame) with every text cell that a spreadsheet would run as a formula
    (one starting with ``=``, ``+``, ``-``, ``@``, tab or CR: ``=HYPERLINK(...)``) given a leading
    ``'``, the usual quoting (OWASP's "CSV injection"). Columns of numbers are left as they are: a
    negative number is not text. Write a CSV of values from the data through this."""
    import polars as pl

    texts = [c for c, t in df.schema.items() if t in (pl.Utf8, pl.Categorical) or isinstance(t, pl.Enum)]
    prefix = "^[" + "".join("\\t" if p == "\t" else "\\r" if p == "\r" else "\\" + p for p in FORMULA_PREFIXES) + "]"
    return df.with_columns(pl.when(pl.col(c).cast(pl.Utf8).str.contains(prefix))
                           .then(pl.lit("'") + pl.col(c).cast(pl.Utf8)).otherwise(pl.col(c).cast(pl.Utf8)).alias(c)
                           for c in texts)


def write_frame(df, path: str | os.PathLike) -> None:
    """Write a polars frame to ``path`` atomically, owner-only: CSV (by extension; its text cells
    through :func:`csv_neutral`) or Parquet (the data as they are)."""
    with atomic_path(path, private=True) as tmp:
        if str(path).lower().endswith(".csv"):
            csv_neutral(df).write_csv(tmp)
        else:
            df.write_parquet(tmp)
