"""``Checkpoint``: one view over any source (HF folder, .safetensors, .gguf, hub repo).

Opening reads headers only.  ``read(name)`` reads just that tensor's bytes and
returns a numpy array (BF16/F8 widened to float32, GGUF quantized types
dequantized to float32).  Nothing here imports torch.

Format readers register themselves in ``_OPENERS`` style dispatch below; a file is
identified by its magic bytes, never by its extension alone.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .errors import ConfigError, FormatError, PickleRefusedError, SourceNotFoundError
from .formats import safetensors as st
from .formats.magic import file_kind
from .formats.safe_input import check_regular, read_json
from .records import TensorInfo

PICKLE_NAMES = ("pytorch_model.bin", "model.pt", "model.pth", "pytorch_model.bin.index.json")
_SHARD_NAME = re.compile(r"-\d{5}-of-(\d{5})\.safetensors$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class Checkpoint:
    """A source's config, tensor index and lazy reads."""

    source: str
    format: str                              # safetensors | gguf | pickle | hub-safetensors | hub-gguf
    config: dict | None
    config_path: str | None
    tensors: dict                            # name -> TensorInfo
    naming: str = "hf"                       # hf | gguf
    gguf_arch: str | None = None
    metadata: dict = field(default_factory=dict)   # safetensors __metadata__ / GGUF key-values
    files: tuple = ()
    _readers: dict = field(default_factory=dict, repr=False)   # file -> object with read(info) / bytes_read
    warnings: list = field(default_factory=list)
    missing_bytes: int = 0                   # truncated file: bytes the header promises that are absent
    file_summary: dict = field(default_factory=dict)   # GGUF: general.name, architecture, context length ... (inspect's file_metadata)

    def read(self, name: str) -> np.ndarray:
        info = self.tensors[name]
        return self._readers[info.file].read(info)

    def read_raw(self, name: str) -> bytes:
        info = self.tensors[name]
        return self._readers[info.file].read_bytes(info)

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
        sub = self._rows(name, start, stop)
        reader = self._readers[sub.file]
        return reader.read_bytes(sub) if raw else reader.read(sub)

    def read_rows_into(self, name: str, start: int, stop: int, out) -> memoryview:
        """The stored bytes of rows ``start:stop`` written into ``out`` (a writable buffer at least
        that large, reused across calls: no allocation per chunk); returns the filled view."""
        sub = self._rows(name, start, stop)
        view = memoryview(out).cast("B")[:sub.nbytes]
        reader = self._readers[sub.file]
        if hasattr(reader, "read_into"):       # local safetensors: preadv straight into the buffer
            reader.read_into(sub, view)
        else:
            view[:] = reader.read_bytes(sub)
        return view

    def prefetch(self, names) -> None:
        """Hint that these tensors will be read next.  Remote readers fetch them in one
        coalesced, parallel batch; local readers have no ``prefetch`` and ignore it."""
        batches: dict[int, tuple] = {}
        for name in names:
            info = self.tensors.get(name)
            reader = self._readers.get(info.file) if info is not None and not info.missing else None
            if reader is not None and hasattr(reader, "prefetch"):
                batches.setdefault(id(reader), (reader, []))[1].append(info)
        for reader, infos in batches.values():
            reader.prefetch(infos)

    @property
    def bytes_read(self) -> int:
        return sum(getattr(r, "bytes_read", 0) for r in set(self._readers.values()))

    @property
    def requests(self) -> int:
        return sum(getattr(r, "requests", 0) for r in set(self._readers.values()))

    def close(self) -> None:
        for r in set(self._readers.values()):
            close = getattr(r, "close", None)
            if close:
                close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def layout(self, *, shapes: bool = True, all_layers: bool = True):
        """The resolved :class:`~ckpt_surgeon.arch.resolve.ModelLayout` (config values checked, config
        and tensors in agreement).  ``shapes=False`` / ``all_layers=False`` leave the per-tensor
        shape check / the every-layer-has-tensors check to a caller that makes it itself (the
        converters compare every shape with transformers' model; lint reports empty layers)."""
        from .arch.resolve import resolve
        return resolve(self.config, self.tensors, naming=self.naming, config_source=self.config_path,
                       gguf_arch=self.gguf_arch, partial=self.is_one_shard or not all_layers, shapes=shapes)

    @property
    def is_one_shard(self) -> bool:
        """A single file opened on its own that is one shard of a sharded model
        (``model-00002-of-00004.safetensors``): it holds only some of the config's layers."""
        m = _SHARD_NAME.search(os.path.basename(self.source))
        return bool(m) and int(m.group(1)) > 1


def _load_config(folder: Path) -> tuple[dict | None, str | None]:
    p = folder / "config.json"
    if not os.path.lexists(p):
        return None, None
    return read_json(p, error=ConfigError), str(p)


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


def _open_safetensors_files(paths: list[Path]) -> tuple[dict, dict, dict]:
    tensors, readers, metadata = {}, {}, {}
    for p in paths:
        lf = st.LocalFile(p)
        readers[lf.path] = lf
        metadata.update(lf.header.metadata)
        for name, info in lf.header.tensors.items():
            if name in tensors:
                raise FormatError(f"tensor appears in two files ({tensors[name].file} and {lf.path})", path=lf.path, tensor=name)
            tensors[name] = info
    return tensors, readers, metadata


def _open_hf_folder(folder: Path, allow_pickle: bool) -> Checkpoint:
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
        tensors, readers, metadata = _open_safetensors_files([Path(s) for s in shards])
        for shard, names in shards.items():
            for tname in names:
                info = tensors.get(tname)
                if info is None or os.path.realpath(info.file) != os.path.realpath(shard):
                    raise FormatError(f"weight_map says this tensor is in {os.path.basename(shard)}, but that file does not hold it",
                                      path=str(index), tensor=tname)
        unlisted = sorted(set(tensors) - set(wm))
        ck = Checkpoint(str(folder), "safetensors", config, config_path, tensors, metadata=metadata,
                        files=tuple(shards), _readers=readers)
        if unlisted:
            ck.warnings.append(f"{len(unlisted)} tensor(s) in the shards are not in {index.name}'s weight_map: {unlisted[:3]}")
        return ck
    single = folder / "model.safetensors"
    files = [single] if single.is_file() else sorted(folder.glob("*.safetensors"))
    if files:
        tensors, readers, metadata = _open_safetensors_files(files)
        return Checkpoint(str(folder), "safetensors", config, config_path, tensors, metadata=metadata,
                          files=tuple(str(f) for f in files), _readers=readers)
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return _open_file(ggufs[0], allow_pickle)
    if len(ggufs) > 1:
        # The parts of one split GGUF (name-00001-of-00003.gguf ...) are one model: opened as a set.
        from .formats.gguf import describe_gguf_groups, group_gguf_names
        groups = group_gguf_names(g.name for g in ggufs)
        if len(groups) == 1:
            return _open_file(folder / groups[0][0], allow_pickle)
        if all(len(g) == 1 for g in groups):
            raise SourceNotFoundError(f"folder holds {len(ggufs)} GGUF files ({', '.join(g.name for g in ggufs[:4])}); "
                                      "pass one of them", path=str(folder))
        raise SourceNotFoundError(f"folder holds {len(groups)} GGUF models ({describe_gguf_groups(groups)}); pass one "
                                  "of them (any part of a split GGUF opens all its parts)", path=str(folder))
    for pn in PICKLE_NAMES:
        if (folder / pn).is_file():
            return _open_pickle(folder / pn, allow_pickle, config, config_path)
    raise SourceNotFoundError("no model.safetensors, sharded safetensors index, or .gguf file found", path=str(folder))


def _open_pickle(path: Path, allow_pickle: bool, config=None, config_path=None) -> Checkpoint:
    if not allow_pickle:
        raise PickleRefusedError(
            "is a pickle checkpoint; unpickling can run arbitrary code, so it is not loaded",
            path=str(path), hint="convert it to safetensors, or pass --allow-pickle to load it with torch.load(weights_only=True)")
    from .formats.pickle import open_pickle
    return open_pickle(path, config, config_path)


def _open_file(path: Path, allow_pickle: bool) -> Checkpoint:
    kind = file_kind(path)
    if kind == "gguf":
        from .formats.gguf import open_gguf_checkpoint  # GGUF reader (issue 3)
        return open_gguf_checkpoint(path)
    if kind == "pickle":
        config, config_path = _load_config(path.parent)
        return _open_pickle(path, allow_pickle, config, config_path)
    config, config_path = _load_config(path.parent)
    tensors, readers, metadata = _open_safetensors_files([path])
    return Checkpoint(str(path), "safetensors", config, config_path, tensors, metadata=metadata,
                      files=(str(path),), _readers=readers)


def looks_like_repo_id(source: str) -> bool:
    return bool(_REPO_ID.match(source)) and not source.startswith((".", "/"))


def open_checkpoint(source: str | os.PathLike, *, allow_pickle: bool = False, revision: str | None = None,
                    file: str | None = None, allow_full_download: bool = False,
                    progress: bool | None = None) -> Checkpoint:
    """Open any supported source.  Reads headers (and config) only.  ``progress``: bars on stderr
    for Hub fetches (None: only when stderr is a terminal; see :mod:`ckpt_surgeon.progress`)."""
    s = os.fspath(source)
    p = Path(s)
    if p.exists():
        if p.is_dir():
            return _open_hf_folder(p, allow_pickle)
        return _open_file(p, allow_pickle)
    if looks_like_repo_id(s):
        from .formats.hub import open_hub_checkpoint  # Hub reader (issue 4)
        return open_hub_checkpoint(s, revision=revision, file=file, allow_full_download=allow_full_download,
                                   progress=progress)
    raise SourceNotFoundError("no such file or folder (and not a Hub repo id of the form owner/name)", path=s)


def tensor_info_json(info: TensorInfo) -> dict:
    return {"name": info.name, "dtype": info.dtype, "shape": list(info.shape), "missing": info.missing}
