"""``Checkpoint``: one view over any source (HF folder, .safetensors, .gguf, hub repo).

Opening reads headers only.  ``read(name)`` reads just that tensor's bytes and
returns a numpy array (BF16/F8 widened to float32, GGUF quantized types
dequantized to float32).  Nothing here imports torch.

A checkpoint holds one reader (:class:`~ckpt_surgeon.formats.source.TensorSource`, the protocol
every format implements) plus what the checkpoint knows beyond bytes: the config, the naming,
the source's name.  :func:`open_checkpoint` decides what the source is (a folder, a file by its
magic bytes, never its extension alone, or a Hub repo id) and opens it through the one entry for
that kind in ``_OPENERS``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .arch.gguf_config import config_from_gguf
from .arch.resolve import resolve
from .errors import ConfigError, FormatError, PickleRefusedError, SourceNotFoundError, TruncatedError
from .formats import gguf as gg
from .formats import safetensors as st
from .formats.hub.ranges import open_hub
from .formats.magic import file_kind
from .formats.pickle import open_pickle
from .formats.quant.schemes import Quantization, config_method, detect, modelopt_quant_config, undeclared
from .formats.quant.quantized import QuantizedSource
from .formats.safe_input import check_regular, read_json
from .formats.source import ShardSet, TensorSource
from .records import TensorInfo

PICKLE_NAMES = ("pytorch_model.bin", "model.pt", "model.pth", "pytorch_model.bin.index.json")
_SHARD_NAME = re.compile(r"-\d{5}-of-(\d{5})\.safetensors$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class Checkpoint:
    """A source's config, tensor index and lazy reads."""

    source: str
    format: str                              # safetensors | gguf | pickle | hub-safetensors | hub-gguf | transformers
    config: dict | None
    config_path: str | None
    reader: TensorSource = field(repr=False)  # tensors, metadata, files, reads and byte counters
    naming: str = "hf"                       # hf | gguf
    gguf_arch: str | None = None
    warnings: list = field(default_factory=list)
    file_summary: dict = field(default_factory=dict)   # GGUF: general.name, architecture, context length ... (inspect's file_metadata)
    as_stored: bool = False                  # no quantization view (:func:`open_stored`)
    side_files: object = field(default=None, repr=False)   # tokenizer / template files beside the weights

    quantization: Quantization | None = field(default=None, init=False)   # set when config.json declares one

    def __post_init__(self):
        self.warnings = [*self.reader.warnings, *self.warnings]
        if self.side_files is None and self.naming == "hf" and not self.format.startswith("hub"):
            folder = Path(self.source) if os.path.isdir(self.source) else \
                (Path(self.config_path).parent if self.config_path else None)
            if folder is not None:
                from .formats.side_files import FolderFiles
                self.side_files = FolderFiles(folder)
        if self.as_stored:
            return
        if self.naming == "hf" and config_method(self.config) is None:
            tell = undeclared(self.config, self.reader.tensors)
            if tell is not None:
                raise FormatError("is stored quantized, but config.json declares no quantization_config (or MLX "
                                  "quantization): its codes would be read as weights", path=self.config_path, tensor=tell)
        if self.naming == "hf" and config_method(self.config) is not None:
            # a quantized checkpoint: the rest of the code sees one dense weight per Linear
            q = detect(self.config, self.reader.tensors, self.config_path)
            self.reader = QuantizedSource(self.reader, q, self.source)
            self.quantization = self.reader.quantization

    @property
    def stored_tensors(self) -> dict:
        """name -> info of what the files store (packed weights and their scales included); equal
        to :attr:`tensors` unless the checkpoint is quantized."""
        return self.reader.stored.tensors if self.quantization is not None else self.reader.tensors

    @property
    def tensors(self) -> dict:
        """name -> :class:`~ckpt_surgeon.records.TensorInfo`."""
        return self.reader.tensors

    @property
    def metadata(self) -> dict:
        """safetensors ``__metadata__`` (merged over shards) / GGUF key-values."""
        return self.reader.metadata

    @property
    def files(self) -> tuple[str, ...]:
        return self.reader.files

    @property
    def missing_bytes(self) -> int:
        """Truncated file: bytes the header promises that are absent."""
        return self.reader.missing_bytes

    def refuse_truncated(self, hint: str | None = None) -> None:
        """TruncatedError when tensor data lies past the end of the file (a GGUF cut short): the one
        line every command that needs the data gives, before any work (issue 36: analyze used to
        report a truncated file with exit 0).  Only ``inspect`` shows such a file's structure."""
        names = [n for n, t in self.tensors.items() if t.missing]
        if not names and not self.missing_bytes:
            return
        raise TruncatedError.cut_short(self.missing_bytes, names,
                                       (self.tensors[names[0]].file if names else None) or self.source, hint)

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read

    @property
    def requests(self) -> int:
        return self.reader.requests

    def read(self, name: str) -> np.ndarray:
        return self.reader.read(self.tensors[name])

    def read_raw(self, name: str) -> bytes:
        """The stored bytes of a stored tensor (of a quantized checkpoint: its packed weights and
        companions by their stored names, the codes of a weight stored under its logical name; a
        logical weight that is not stored (GPTQ's ``weight`` made from ``qweight``) is refused)."""
        if self.quantization is not None and name in self.stored_tensors:
            return self.reader.stored.read_bytes(self.stored_tensors[name])
        return self.reader.read_bytes(self.tensors[name])

    def read_raw_into(self, name: str, out) -> None:
        """:meth:`read_raw` into the caller's writable buffer of exactly the tensor's size (no
        intermediate ``bytes``: one copy of a large tensor in memory, not two)."""
        if self.quantization is not None and name in self.stored_tensors:
            return self.reader.stored.read_into(self.stored_tensors[name], out)
        return self.reader.read_into(self.tensors[name], out)

    def read_stored(self, name: str) -> np.ndarray:
        """A stored tensor decoded as stored (a quantized weight's codes, its scales)."""
        src = self.reader.stored if self.quantization is not None else self.reader
        return src.read(self.stored_tensors[name])

    def _rows(self, name: str, start: int, stop: int) -> TensorInfo:
        info = self.tensors[name]
        rows = info.shape[0] if info.shape else 1
        if not 0 <= start <= stop <= rows:
            raise ValueError(f"rows {start}:{stop} outside 0:{rows} of tensor '{name}'")
        per_row = info.nbytes // max(rows, 1)
        return replace(info, shape=((stop - start,) + tuple(info.shape[1:])) if info.shape else (),
                       start=info.start + start * per_row, end=info.start + stop * per_row)

    def read_rows(self, name: str, start: int, stop: int, *, raw: bool = False):
        """Rows ``start:stop`` of the outermost axis, reading only their bytes: decoded like
        :meth:`read` or, with ``raw``, the stored bytes.  Lets a caller stream a large tensor in
        bounded memory (a quantized GGUF row is whole blocks, so any row range decodes)."""
        if self.quantization is not None and name in self.quantization.tensors and not raw:
            info = self.tensors[name]
            if not 0 <= start <= stop <= info.shape[0]:
                raise ValueError(f"rows {start}:{stop} outside 0:{info.shape[0]} of tensor '{name}'")
            if self.reader.rows_readable(name):
                return self.reader.dequantize_rows(name, start, stop)
            return self.reader.dequantize(name)[start:stop]
        sub = self._rows(name, start, stop)
        return self.reader.read_bytes(sub) if raw else self.reader.read(sub)

    def read_rows_into(self, name: str, start: int, stop: int, out) -> memoryview:
        """The stored bytes of rows ``start:stop`` written into ``out`` (a writable buffer at least
        that large, reused across calls: no allocation per chunk); returns the filled view.  Local
        files are read with preadv straight into the buffer."""
        sub = self._rows(name, start, stop)
        view = memoryview(out).cast("B")[:sub.nbytes]
        self.reader.read_into(sub, view)
        return view

    def prefetch(self, names) -> None:
        """Hint that these tensors will be read next.  Remote readers fetch them in one
        coalesced, parallel batch; local readers ignore it."""
        infos = [self.tensors[n] for n in names if n in self.tensors]
        self.reader.prefetch([i for i in infos if not i.missing])

    def close(self) -> None:
        self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def missing_config(self) -> str | None:
        """Where config.json was looked for when an HF-named source has none (None: it has one, or
        needs none: GGUF keeps its settings in its metadata)."""
        if self.naming != "hf" or self.config is not None or self.format == "transformers":
            return None
        if self.format.startswith("hub"):
            return f"{self.source}/config.json"
        p = Path(self.source)
        return str((p if p.is_dir() else p.parent) / "config.json")

    def missing_config_warning(self) -> str | None:
        """The one sentence inspect, analyze and lint say about a missing config.json (issue 24:
        they showed heads 'None / None / None' and blamed an unknown architecture)."""
        where = self.missing_config
        if where is None:
            return None
        return (f"config.json is missing ({where}): without it the architecture, the heads / kv heads / head_dim, "
                "the position encoding (rotary or not) and so every key-bias class cannot be known, and "
                "transformers cannot load the folder; only tensor names, shapes and bias norms are shown")

    def layout(self, *, shapes: bool = True, all_layers: bool = True):
        """The resolved :class:`~ckpt_surgeon.arch.resolve.ModelLayout` (config values checked, config
        and tensors in agreement).  ``shapes=False`` / ``all_layers=False`` leave the per-tensor
        shape check / the every-layer-has-tensors check to a caller that makes it itself (the
        converters compare every shape with transformers' model; lint reports empty layers)."""
        return resolve(self.config, self.tensors, naming=self.naming, config_source=self.config_path,
                       gguf_arch=self.gguf_arch, partial=self.is_one_shard or not all_layers, shapes=shapes)

    @property
    def is_one_shard(self) -> bool:
        """A single file opened on its own that is one shard of a sharded model
        (``model-00002-of-00004.safetensors``): it holds only some of the config's layers."""
        m = _SHARD_NAME.search(os.path.basename(self.source))
        return bool(m) and int(m.group(1)) > 1


@dataclass(frozen=True)
class _Options:
    """What :func:`open_checkpoint` was asked, for the opener that needs it."""

    allow_pickle: bool = False
    revision: str | None = None
    file: str | None = None
    allow_full_download: bool = False
    progress: bool | None = None
    stored: bool = False


def _load_config(folder: Path) -> tuple[dict | None, str | None]:
    p = folder / "config.json"
    if not os.path.lexists(p):
        return None, None
    config = read_json(p, error=ConfigError)
    hq = folder / "hf_quant_config.json"
    if isinstance(config, dict) and "quantization_config" not in config and os.path.isfile(hq):
        # ModelOpt releases whose config.json names no quantization: hf_quant_config.json says it
        # (llama.cpp's converter reads it the same way, ModelBase.prepare_tensors)
        q = modelopt_quant_config(read_json(hq, error=ConfigError))
        if q is not None:
            config = {**config, "quantization_config": q}
    return config, str(p)


def _safe_member(folder: Path, rel: str, index_path: str, tensor: str) -> Path:
    """A weight_map entry must *name* a file inside the folder: no '..', no absolute path, no
    backslash, no empty name.

    Symlinks are followed wherever they point.  They are the user's own filesystem, and the
    standard Hugging Face cache layout depends on them: ``hf download`` (without ``--local-dir``)
    and ``snapshot_download()`` store ``snapshots/<commit>/model-00001-of-00002.safetensors`` as a
    symlink to ``../../blobs/<sha256>`` (huggingface_hub ``file_download.py``,
    ``_create_symlink``).  What a hostile index could do with a *name* (climb out of the folder,
    point at an absolute path) is refused here; what a symlink the user made points at is theirs.
    """
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or "\\" in rel or ".." in Path(rel).parts:
        raise FormatError(f"weight_map names {rel!r}, which is not a plain file inside the folder", path=index_path, tensor=tensor)
    p = folder / rel
    if not os.path.exists(p):   # False (not an exception) for NUL bytes, unencodable names, symlink loops
        raise FormatError(f"weight_map names shard {rel!r}, which does not exist", path=index_path, tensor=tensor)
    _regular_member(p, rel, index_path, tensor)
    return p


def _regular_member(path: Path, rel: str, index_path: str, tensor: str) -> None:
    """A shard must be a regular file: opening a FIFO blocks forever, a device never ends."""
    try:
        check_regular(path)
    except FormatError as e:
        raise FormatError(f"weight_map names {rel!r}, which {e.detail}", path=index_path, tensor=tensor) from None


def _safetensors_files(paths) -> ShardSet:
    return ShardSet([st.LocalFile(p) for p in paths])


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _open_hf_folder(folder: Path, opts: _Options) -> Checkpoint:
    """An HF folder: its safetensors (through the index when there is one), else its GGUF (one
    model, maybe split), else a pickle (behind ``allow_pickle``)."""
    config, config_path = _load_config(folder)
    index = folder / "model.safetensors.index.json"
    if os.path.lexists(index):
        idx = read_json(index, error=FormatError, require_object=False)
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise FormatError("has no weight_map object", path=str(index))
        shards = {}
        for tname, rel in wm.items():
            shards.setdefault(str(_safe_member(folder, rel, str(index), tname)), []).append(tname)
        reader = _safetensors_files(shards)
        warnings = st.check_weight_map(reader.tensors, shards, wm, str(index), same_file=_same_file)
        return Checkpoint(str(folder), "safetensors", config, config_path, reader, warnings=list(warnings),
                          as_stored=opts.stored)
    single = folder / "model.safetensors"
    files = [single] if single.is_file() else sorted(folder.glob("*.safetensors"))
    if files:
        return Checkpoint(str(folder), "safetensors", config, config_path, _safetensors_files(files),
                          as_stored=opts.stored)
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return _open_file(ggufs[0], opts)
    if len(ggufs) > 1:
        # The parts of one split GGUF (name-00001-of-00003.gguf ...) are one model: opened as a set.
        groups = gg.group_gguf_names(g.name for g in ggufs)
        if len(groups) == 1:
            return _open_file(folder / groups[0][0], opts)
        if all(len(g) == 1 for g in groups):
            raise SourceNotFoundError(f"folder holds {len(ggufs)} GGUF files ({', '.join(g.name for g in ggufs[:4])}); "
                                      "pass one of them", path=str(folder))
        raise SourceNotFoundError(f"folder holds {len(groups)} GGUF models ({gg.describe_gguf_groups(groups)}); pass one "
                                  "of them (any part of a split GGUF opens all its parts)", path=str(folder))
    for pn in PICKLE_NAMES:
        if (folder / pn).is_file():
            return _open_pickle(folder / pn, opts)
    raise SourceNotFoundError("no model.safetensors, sharded safetensors index, or .gguf file found", path=str(folder))


def _open_safetensors(path: Path, opts: _Options) -> Checkpoint:
    config, config_path = _load_config(path.parent)
    return Checkpoint(str(path), "safetensors", config, config_path, _safetensors_files([path]))


def _open_pickle(path: Path, opts: _Options) -> Checkpoint:
    if not opts.allow_pickle:
        raise PickleRefusedError(
            "is a pickle checkpoint; unpickling can run arbitrary code, so it is not loaded",
            path=str(path), hint="convert it to safetensors, or pass --allow-pickle to load it with torch.load(weights_only=True)")
    config, config_path = _load_config(path.parent)
    return Checkpoint(str(path), "pickle", config, config_path, open_pickle(path))


def _gguf_checkpoint(source: str, fmt: str, g: gg.GGUFFile | gg.SplitGGUF, summary: dict | None = None) -> Checkpoint:
    """A GGUF reader (local or remote, one file or a split set) as a checkpoint: the HF-style
    config is derived from its metadata (the reader is closed if that fails)."""
    try:
        config = config_from_gguf(g.metadata, g.tensors, path=g.path, read=g.read)
    except Exception:
        g.close()
        raise
    return Checkpoint(source, fmt, config, g.path, g, naming="gguf", gguf_arch=g.architecture,
                      file_summary={**gg.gguf_summary(g), **(summary or {})})


def open_gguf_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Open a local ``.gguf`` (or any part of a split GGUF: the whole set) as a
    :class:`Checkpoint` (headers only)."""
    return _gguf_checkpoint(os.fspath(path), "gguf", gg.open_gguf(path))


def _open_gguf(path: Path, opts: _Options) -> Checkpoint:
    return open_gguf_checkpoint(path)


def open_hub_checkpoint(repo_id: str, *, revision: str | None = None, file: str | None = None,
                        allow_full_download: bool = False, progress: bool | None = None) -> Checkpoint:
    """Open a Hub model repo as a :class:`Checkpoint`, reading only headers (see
    :func:`ckpt_surgeon.formats.hub.ranges.open_hub` for the arguments).  When the Hugging Face cache
    holds every file the remote path would read, those local files are opened instead."""
    h = open_hub(repo_id, revision=revision, file=file, allow_full_download=allow_full_download, progress=progress)
    if h.local is not None:
        ck = _open_path(h.local, _Options())
        ck.warnings.extend(h.warnings)
        return ck
    if h.format == "hub-gguf":
        return _gguf_checkpoint(h.source, h.format, h.reader, h.summary)
    return Checkpoint(h.source, h.format, h.config, h.config_path, h.reader, warnings=list(h.warnings),
                      file_summary=h.summary, side_files=h.side_files)


def _open_hub(repo_id: str, opts: _Options) -> Checkpoint:
    return open_hub_checkpoint(repo_id, revision=opts.revision, file=opts.file,
                               allow_full_download=opts.allow_full_download, progress=opts.progress)


# What the source is -> how it opens.  A file's kind comes from its magic bytes
# (formats/magic.py); a new format adds its reader in formats/ and one entry here.
_OPENERS: dict[str, Callable[..., Checkpoint]] = {
    "folder": _open_hf_folder,          # HF folder: safetensors (index or files), else GGUF, else pickle
    "safetensors": _open_safetensors,   # u64 header length + JSON header
    "gguf": _open_gguf,                 # b"GGUF" (any part of a split GGUF opens the set)
    "pickle": _open_pickle,             # zip or pickle protocol opcode, behind allow_pickle
    "hub": _open_hub,                   # owner/name: HTTP ranges, or the Hugging Face cache when complete there
}


def _open_file(path: Path, opts: _Options) -> Checkpoint:
    return _OPENERS[file_kind(path)](path, opts)


def _open_path(p: Path, opts: _Options) -> Checkpoint:
    return _OPENERS["folder"](p, opts) if p.is_dir() else _open_file(p, opts)


def heads_cell(missing_config: str | None) -> str | None:
    """What a summary shows for a setting only config.json holds, when it is missing."""
    return "unknown: config.json is missing" if missing_config else None


def looks_like_repo_id(source: str) -> bool:
    return bool(_REPO_ID.match(source)) and not source.startswith((".", "/"))


def missing_local(source: str) -> SourceNotFoundError:
    """The error for a ``source`` that does not exist here and is not to be looked up on the Hub:
    one not shaped ``owner/name``, or one whose first component exists locally (``play/qwen2-64x``
    beside a folder ``play`` is a typo of a local path: asking the Hub would only cost retries)."""
    first = source.split("/", 1)[0]
    if looks_like_repo_id(source) and os.path.lexists(first):
        return SourceNotFoundError(f"no such file or folder ({first}/ exists here, so this is read as a local path, "
                                   "not a Hub repo id)", path=source)
    return SourceNotFoundError("no such file or folder (and not a Hub repo id of the form owner/name)", path=source)


def is_hub_source(source: str) -> bool:
    """``source`` (which does not exist locally) is to be opened as a Hub repo id."""
    return looks_like_repo_id(source) and not os.path.lexists(source.split("/", 1)[0])


def open_checkpoint(source: str | os.PathLike, *, allow_pickle: bool = False, revision: str | None = None,
                    file: str | None = None, allow_full_download: bool = False,
                    progress: bool | None = None) -> Checkpoint:
    """Open any supported source, reading headers (and config) only; tensors are read on demand.

    ``source``: an HF folder, a ``.safetensors`` or ``.gguf`` file (any part of a split set), or a Hub repo id
    (``revision``, ``file``, ``allow_full_download``: as the CLI's options).  ``allow_pickle``: read
    ``pytorch_model.bin`` through ``torch.load(weights_only=True)``.  ``progress``: bars on stderr for Hub
    fetches (None: only when stderr is a terminal).

    Returns:
        :class:`~ckpt_surgeon.checkpoint.Checkpoint`

    Example::

        from ckpt_surgeon import open_checkpoint
        with open_checkpoint("model.gguf") as ck:
            ck.config["num_hidden_layers"], ck.format
            w = ck.read("blk.0.attn_q.weight")        # float32 numpy array, dequantized
    """
    s = os.fspath(source)
    p = Path(s)
    opts = _Options(allow_pickle, revision, file, allow_full_download, progress)
    if p.exists():
        return _open_path(p, opts)
    if is_hub_source(s):
        return _OPENERS["hub"](s, opts)
    raise missing_local(s)


def open_stored(folder: str | os.PathLike) -> Checkpoint:
    """An HF folder's safetensors exactly as stored, whatever its config.json declares: no
    quantization view (FP8 / MXFP4 codes, packed weights and their scales under their stored
    names), for a reader that applies the quantization itself (llama.cpp's converter classes on
    the derived path, :mod:`ckpt_surgeon.conversion.derived`)."""
    return _open_hf_folder(Path(os.fspath(folder)), _Options(stored=True))


def tensor_info_json(info: TensorInfo) -> dict:
    return {"name": info.name, "dtype": info.dtype, "shape": list(info.shape), "missing": info.missing}
