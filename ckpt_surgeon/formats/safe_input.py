"""Reading untrusted input files: only regular files, JSON with size, depth and integer limits.

Every file ckpt-surgeon reads comes from a user (or a stranger on the Hub), so two rules hold for
all of them, here in one place:

* **Only regular files are opened.**  A ``weight_map`` entry, a ``config.json`` or a side file
  may name a FIFO (``open`` blocks forever waiting for a writer), a device (``/dev/zero`` never
  ends) or a folder.  :func:`open_regular` ``stat``s the path first and refuses anything but a
  regular file; it then opens with ``O_NONBLOCK`` (so a FIFO swapped in between the two calls
  still cannot block) and checks the opened descriptor again with ``fstat``.
* **JSON is parsed with limits.**  :func:`loads_json` refuses documents over a size limit,
  nested deeper than :data:`MAX_JSON_DEPTH` (CPython's decoder recurses once per level: 100,000
  levels end in ``RecursionError``) and integers longer than :data:`MAX_INT_DIGITS` digits
  (CPython refuses to convert more than 4,300 digits with a bare ``ValueError``; no count, size
  or offset in a checkpoint needs more than 20).  Duplicate object keys are refused, as the
  safetensors Rust core (serde) does.  Every failure is the caller's typed error, one line.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import stat

import numpy as np

from ..errors import FormatError, SourceNotFoundError

MAX_JSON_DEPTH = 128              # objects/arrays inside each other; real configs use < 10
MAX_INT_DIGITS = 40               # 2**64 has 20 digits
MAX_JSON_FILE = 256 << 20         # config / index / tokenizer files (Gemma 3's tokenizer.json is 33 MB)

# A JSON string (with escapes), matched without backtracking (possessive quantifiers, Python 3.11).
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_DIGITS_AS_ZERO = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))    # every digit "0", every other byte " "
_LONG_DIGITS = re.compile(rb"[0-9]{%d,}" % (MAX_INT_DIGITS + 1))
_KIND = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFDIR: "a folder", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def _kind(mode: int) -> str:
    return _KIND.get(stat.S_IFMT(mode), "not a regular file")


def check_regular(path: str | os.PathLike, *, error=FormatError, what: str = "") -> int:
    """``stat`` ``path`` (following symlinks) and return its size; raise ``error`` unless it is a
    regular file (reading a FIFO blocks forever, a device never ends)."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SourceNotFoundError(_say(what, "does not exist"), path=path) from None
    except (OSError, ValueError) as e:      # permission, symlink loop, name too long, NUL byte ...
        raise error(_say(what, f"cannot be read ({getattr(e, 'strerror', None) or e})"), path=path) from None
    if not stat.S_ISREG(st.st_mode):
        raise error(_say(what, f"is {_kind(st.st_mode)}, not a regular file; only regular files are read"), path=path)
    return st.st_size


def open_regular(path: str | os.PathLike, *, error=FormatError, what: str = "") -> int:
    """Open a regular file read-only and return the descriptor (see the module doc)."""
    check_regular(path, error=error, what=what)
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(_say(what, f"is {_kind(st.st_mode)}, not a regular file; only regular files are read"),
                        path=os.fspath(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike, *, max_bytes: int, error=FormatError, what: str = "") -> bytes:
    """The whole content of a regular file of at most ``max_bytes`` bytes."""
    fd = open_regular(path, error=error, what=what)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise error(_say(what, f"is {size:,} bytes, over the {max_bytes:,}-byte limit for this kind of file"),
                        path=os.fspath(path))
        chunks, got = [], 0
        while got <= max_bytes:
            b = os.read(fd, min(1 << 24, max_bytes + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > max_bytes:
            raise error(_say(what, f"grew past the {max_bytes:,}-byte limit while being read"), path=os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


class _Refused(Exception):
    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"key {k[:80]!r} appears twice in one object", key=k)
        out[k] = v
    return out


def _say(what: str, rest: str) -> str:
    return f"{what} {rest}" if what else rest


def _bracket_depth(raw: bytes) -> int:
    """Deepest running count of ``[``/``{`` minus ``]``/``}`` (vectorised, 4 MiB at a time)."""
    a = np.frombuffer(raw, np.uint8)
    deepest, level = 0, 0
    for i in range(0, len(a), 1 << 22):
        c = a[i:i + (1 << 22)]
        step = ((c == 91) | (c == 123)).astype(np.int8) - ((c == 93) | (c == 125)).astype(np.int8)
        run = np.cumsum(step, dtype=np.int64)
        if len(run):
            deepest = max(deepest, level + int(run.max()))
            level += int(run[-1])
    return deepest


def json_depth(raw: bytes) -> int:
    """Deepest nesting of ``[``/``{`` outside strings, without recursion.  Cheap in the common
    case: brackets are counted over the raw bytes first (an upper bound); strings are cut out
    (one regex pass) only when that bound is over the limit."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return 0   # cannot be deeper than it has brackets
    bound = _bracket_depth(raw)
    if bound <= MAX_JSON_DEPTH:
        return bound
    return _bracket_depth(_JSON_STRING.sub(b"", raw))


def _long_integer(raw: bytes) -> int:
    """Digits of the longest run of over :data:`MAX_INT_DIGITS` digits outside strings (0: none)."""
    if b"0" * (MAX_INT_DIGITS + 1) not in raw.translate(_DIGITS_AS_ZERO):   # the common case: two C-speed
        return 0                                                             # passes (10x the regex's speed)
    runs = _LONG_DIGITS.findall(_JSON_STRING.sub(b"", raw))
    return max((len(r) for r in runs), default=0)


def loads_json(data: bytes | str, *, path: str | os.PathLike | None = None, error=FormatError,
               max_bytes: int = MAX_JSON_FILE, what: str = "", duplicates_tensor: bool = False):
    """Parse untrusted JSON with the limits of the module doc; every failure is ``error`` (one line).

    ``what`` starts the message ("header ..."); ``duplicates_tensor``: a duplicate key is reported
    as ``error(..., tensor=key)`` (safetensors headers, whose keys are tensor names)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise error(_say(what, f"is {len(raw):,} bytes, over the {max_bytes:,}-byte limit"), path=path)
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise error(_say(what, f"nests JSON objects/arrays {depth:,} deep (at most {MAX_JSON_DEPTH} levels are "
                               "accepted)"), path=path)
    digits = _long_integer(raw)
    if digits:
        # CPython refuses > 4,300 digits with a bare ValueError; no real value needs > 20
        raise error(_say(what, f"holds a number of {digits:,} digits (at most {MAX_INT_DIGITS} are accepted)"),
                    path=path)
    try:
        with paused_gc():
            obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _Refused as e:
        if duplicates_tensor and e.key is not None:
            raise error(_say(what, "names this tensor twice"), path=path, tensor=e.key) from None
        raise error(_say(what, f"is refused: {e}"), path=path) from None
    except RecursionError:   # unreachable after the depth check; kept so that no input escapes untyped
        raise error(_say(what, "nests too deep to parse"), path=path) from None
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, int() refusals
        raise error(_say(what, f"is not valid JSON ({e})"), path=path) from None
    if _SURROGATE_ESCAPE.search(raw):
        bad = _lone_surrogate(obj)
        if bad is not None:
            # "\ud800" decodes to a lone surrogate: not Unicode text (serde_json, which the
            # safetensors and tokenizers parsers use, refuses it), and no UTF-8 encoding exists,
            # so a name holding one could neither be opened as a path nor written to an output.
            raise error(_say(what, f"holds the string {bad[:60]!a} with a lone surrogate (\\u escape of half a "
                                   "UTF-16 pair), which is not valid Unicode"), path=path)
    return obj


@contextlib.contextmanager
def paused_gc():
    """The cyclic garbage collector paused: parsing a 10 MB tokenizer.json, or building a 150k-token record,
    makes millions of containers, and every collection that triggers walks all live objects (a second parsed
    file doubled the time); what these make holds no cycles, and a cycle made meanwhile waits for the next
    collection.  Nests (the collector is enabled again only by the outermost)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _lone_surrogate(obj) -> str | None:
    """The first string (key or value) in ``obj`` that has no UTF-8 encoding, or None."""
    stack = [obj]
    while stack:
        o = stack.pop()
        items = o.items() if isinstance(o, dict) else ((None, x) for x in o) if isinstance(o, list) else ((None, o),)
        for k, v in items:
            for s in (k, v):
                if isinstance(s, str):
                    try:
                        s.encode("utf-8")
                    except UnicodeEncodeError:
                        return s
            if isinstance(v, (dict, list)):
                stack.append(v)
    return None


def read_json(path: str | os.PathLike, *, error=FormatError, max_bytes: int = MAX_JSON_FILE, what: str = "",
              require_object: bool = True):
    """Read and parse a JSON file (regular files only, limits as :func:`loads_json`)."""
    raw = read_regular(path, max_bytes=max_bytes, error=error, what=what)
    obj = loads_json(raw, path=path, error=error, max_bytes=max_bytes, what=what)
    if require_object and not isinstance(obj, dict):
        raise error(_say(what, "is not a JSON object"), path=path)
    return obj
