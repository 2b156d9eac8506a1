"""Typed exceptions.

Library code never prints and never exits: it raises one of these.  The CLI has
one handler that turns any :class:`CkptError` into a single line on stderr and
exit code 2 (see ``ckpt_surgeon/cli/__init__.py``).

Every error carries the fields a user needs to act: the file, the tensor, what
was expected and what was found.  ``str(err)`` is the one-line message.
"""
from __future__ import annotations

import os


class CkptError(Exception):
    """Base class: bad input or usage.  CLI exit code 2."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 tensor: str | None = None, expected=None, got=None, hint: str | None = None):
        self.path = os.fspath(path) if path is not None else None
        self.tensor = tensor
        self.expected = expected
        self.got = got
        self.hint = hint
        self.detail = message
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.path:
            parts.append(str(self.path))
        if self.tensor:
            parts.append(f"tensor '{self.tensor}'")
        head = ": ".join(parts)
        msg = f"{head}: {self.detail}" if head else self.detail
        if self.hint:
            msg = f"{msg} ({self.hint})"
        return msg


class FormatError(CkptError):
    """A file is not what it claims to be (bad header, offsets, dtype ...)."""


class TruncatedError(FormatError):
    """A file ends before the data its header promises."""

    def __init__(self, message: str, *, missing_bytes: int = 0, tensors: tuple[str, ...] = (), **kw):
        self.missing_bytes = missing_bytes
        self.tensors = tuple(tensors)
        super().__init__(message, **kw)

    @classmethod
    def cut_short(cls, missing_bytes: int, names, path, hint: str | None = None) -> TruncatedError:
        """The one line every command gives for a file cut short: the bytes missing and the tensors that
        lie past its end (the first four named)."""
        names = tuple(names)
        return cls(f"file is truncated: {missing_bytes:,} bytes missing; {len(names)} tensor(s) lie past the end of "
                   f"the file ({', '.join(names[:4])}{' ...' if len(names) > 4 else ''})",
                   path=path, missing_bytes=missing_bytes, tensors=names, hint=hint)


class PickleRefusedError(CkptError):
    """A pickle checkpoint was found and --allow-pickle was not given."""


class RemoteCodeRefusedError(CkptError):
    """A model folder's own Python (a module its auto_map names) would run and --trust-remote-code was not given."""


class ConfigError(CkptError):
    """config.json is missing a key or contradicts the tensors."""


class SourceNotFoundError(CkptError):
    """The source path / repo does not exist."""


class UnsupportedError(CkptError):
    """The operation is not defined for this architecture / layout."""


class RefusedError(CkptError):
    """A surgery was refused because it would not be exact (see the message)."""


class OutputExistsError(CkptError):
    """The output exists and --force was not given."""


class WriteError(CkptError):
    """Writing an output failed (disk full, file too large, permission denied, reread check); nothing was left at OUT."""


class HubError(CkptError):
    """A Hugging Face Hub request failed (not found, gated, no Range support ...)."""


class VerificationFailed(CkptError):
    """verify found a mismatch.  CLI exit code 1."""

    exit_code = 1
