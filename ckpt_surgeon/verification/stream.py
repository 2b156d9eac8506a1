"""Layer-streamed forward passes: a model larger than memory run one decoder layer at a time.

``verify --stream`` (and ``verify`` on its own when two models do not fit in memory).  Memory is
one decoder layer plus the activations, not a model:

1. The model is built by transformers itself on the meta device (``from_config`` under
   ``torch.device("meta")``, eager attention): the skeleton has every module of the
   architecture and no storage.
2. Everything that is not a decoder layer, an input embedding or an output head (final norm,
   rotary embedding, learned positions, embedding LayerNorms: small) is materialised once and
   loaded from the checkpoint through transformers' own loader
   (``convert_and_load_state_dict_in_model`` with the model's own conversion mapping, so fused
   MoE experts, renamed and prefixed keys load exactly as ``from_pretrained`` loads them);
   buffers that are not stored (``inv_freq``, position ids) are initialised by the model's own
   ``_init_weights``, as ``from_pretrained`` does.
3. The inputs are embedded once per model: only the embedding rows of the tokens that occur are
   read, into a compact table the model's own embedding module looks up (so scaled embeddings,
   Gemma's ``embed_scale`` included, stay the model's code).
4. The model's own forward runs once per sequence length with every decoder layer's ``forward``
   replaced by a recorder: it builds the masks (causal, sliding-window, bidirectional), rotary
   ``position_embeddings``, ALiBi, ``cache_position`` ... exactly as it does for a real run, and
   the recorder keeps what each layer is called with.  No forward code is retyped here.
5. For each layer: the reference's layer is materialised (``to_empty`` + the checkpoint's
   tensors for that layer, read through :func:`ckpt_surgeon.open_checkpoint`'s readers or
   dequantized from a GGUF through the converter's own name map and permutations), run on the
   reference's hidden states of every sequence, freed; then the candidate's, on its own hidden
   states.  The divergence of the layer's attention, MLP and output is recorded on the way
   (``--localize`` at no extra cost).
6. The tail (final norm, head, logit soft-capping / scaling) is the model's own forward again,
   with the layers replaced by a replay of the last hidden state and the head by a module that
   computes one chunk of the vocabulary: the head is read in row chunks and no ``[T, V]`` array
   wider than one group of sequences is ever held.

GGUF inputs are streamed directly: :func:`ckpt_surgeon.conversion.from_gguf.hf_view` gives the HF
config and the GGUF -> HF tensor plan the converter uses, and each HF tensor is dequantized and
un-permuted when its layer is loaded (no temporary float32 folder).  A quantized HF checkpoint
(GPTQ, AWQ, compressed-tensors, FP8, bitsandbytes, MLX) is streamed the same way: the model is the
unquantized architecture (config without ``quantization_config``) and each quantized weight is
read through :class:`~ckpt_surgeon.formats.quant.quantized.QuantizedSource`, dequantized as its producer
dequantizes it; activations are not quantized (the report says so).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CkptError, ConfigError, UnsupportedError
from ..progress import bar as progress_bar
from .loading import float64_kwargs
from .localize import DEFAULT_THRESHOLDS, DiffAccumulator, LocalizeReport, PointDiff, hook_points, judged
from .localize import rethreshold  # noqa: F401  (its home before issue 35; re-exported)

STREAM_DTYPES = ("float32", "float64", "bfloat16")
# bfloat16 (numpy has none): tensors are read in float32 (exact for stored bf16) and rounded to
# bf16 by torch as they load; spilled hidden states are bf16 bit patterns in a uint16 file; the
# head is applied in float32 to the bf16 final hidden states and bf16 head weights (float32
# logits: no bf16 rounding of the logits the statistics are computed from).
_NP_DTYPES = {"float32": np.float32, "float64": np.float64, "bfloat16": np.float32}   # host staging
_ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2}
# Head rows read per chunk: bounded in bytes, so a 152k x 3584 float64 head (4.4 GB) is read as
# ~34 chunks of 128 MiB, whatever the vocabulary.
HEAD_CHUNK_BYTES = 128 << 20
# Logits held at once (both models, one group of sequences): sequences are grouped so that their
# [rows, V] logits stay under this; the head is re-read once per group.
LOGITS_GROUP_BYTES = 512 << 20
# Hidden states of all sequences (both models) above this go to memory-mapped files in tmp_dir.
ACTIVATIONS_IN_RAM_BYTES = 1 << 30
# Fixed allowance over the weights a streamed run holds: torch's allocator slack, the masks and
# rotary tables of one sequence, the tokenizer.
STREAM_OVERHEAD_BYTES = 256 << 20


class _Stop(Exception):
    """Raised by the last layer's recorder: the rest of the forward is not needed."""


# --------------------------------------------------------------------------- sources


@dataclass
class StreamSource:
    """An input opened for streaming: its HF config and its tensors by HF (checkpoint) name.

    Safetensors inputs (a folder, sharded or not, a single file with config.json beside it, an HF
    cache snapshot) read straight from the checkpoint; a GGUF reads through the converter's plan
    (dequantized, Q/K rows un-permuted, experts unstacked) one HF tensor at a time."""

    given: str
    config: dict
    folder: str | None          # folder holding config.json (AutoConfig reads it), None for GGUF
    ck: object = field(repr=False)
    storage_dtype: str = "float32"
    n_params: int = 0
    gguf: bool = False
    warnings: tuple = ()
    dequantized: object | None = None   # conversion.dense.DequantizedRun: a quantized checkpoint, read dequantized
    _plan: dict | None = field(default=None, repr=False)      # GGUF: HF name -> plan entry
    _hp: dict | None = field(default=None, repr=False)
    _stack_cache: dict = field(default_factory=dict, repr=False)

    def keys(self) -> list[str]:
        return list(self._plan) if self.gguf else [n for n, i in self.ck.tensors.items()]

    def shape(self, key: str) -> tuple:
        return tuple(self._plan[key][3]) if self.gguf else tuple(self.ck.tensors[key].shape)

    def read(self, key: str) -> np.ndarray:
        """The whole HF tensor (float32, or whatever the reader decodes to)."""
        if not self.gguf:
            return self.ck.read(key)
        from ..conversion.from_gguf import hf_array
        return hf_array(self.ck, self._plan[key], self._hp, self._stack_cache)

    def read_rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of an HF tensor, reading only their bytes where the stored layout
        allows it (a plain tensor; a GGUF tensor stored without a transform)."""
        if not self.gguf:
            return self.ck.read_rows(key, start, stop)
        gname, _, transform, *_rest, extra = self._plan[key]
        if transform == "none" and extra is None:
            return self.ck.read_rows(gname, start, stop)
        return self.read(key)[start:stop]

    def drop_cache(self) -> None:
        self._stack_cache.clear()

    def close(self) -> None:
        self.ck.close()


def open_source(source, *, role: str = "candidate", revision: str | None = None,
                progress: bool | None = False) -> StreamSource:
    """Open a verify input for streaming (headers only; no tensor is read).  Bad input is one
    typed error naming the file, as for every other command."""
    if isinstance(source, StreamSource):
        return source
    from .loading import open_input

    given = os.fspath(source)
    _, ck, precision, n_params = open_input(given, revision=revision, progress=progress, verb="streams")
    try:
        if ck.format == "gguf":
            from ..conversion.from_gguf import hf_view
            config, hp, plan, warns = hf_view(ck, Path(ck.source))
            return StreamSource(given, config, None, ck, precision, n_params, gguf=True, warnings=tuple(warns),
                                _plan={entry[1]: entry for entry in plan}, _hp=hp)
        folder = str(Path(ck.config_path).parent)
        from ..conversion.dense import dequantized_run
        # a quantized checkpoint streams its logical layout: every quantized weight dequantized by
        # our reader as its layer loads, into the unquantized architecture
        return StreamSource(given, ck.config, folder, ck, precision, n_params, dequantized=dequantized_run(ck))
    except BaseException:
        ck.close()
        raise


# --------------------------------------------------------------------------- memory planning


def stream_need_from_sizes(layer: int, positions: int, hidden: int, vocab: int, item: int) -> int:
    """Memory a streamed verify needs beyond what the process holds already, in bytes.

    ``layer``: the largest decoder layer in the compute dtype, x3 for the transient copies while
    it loads (the stored bytes decoded, the compute-dtype tensor, a fused-expert concatenation);
    one head chunk per model; the hidden states of both models (x3: the layer's input, its
    output, the attention / MLP outputs kept for the per-layer divergence; beyond
    :data:`ACTIVATIONS_IN_RAM_BYTES` they go to a memory-mapped file); one group of logits; a
    fixed allowance.  ``item``: bytes per element of the compute dtype; what is held in numpy (the
    logits, the attention / MLP outputs kept, a head chunk as read) is float32 for bfloat16
    (:func:`host_item`)."""
    host = host_item(item)
    acts = 2 * positions * hidden * (item + 2 * host)
    logits = min(LOGITS_GROUP_BYTES, 2 * positions * vocab * host)
    head_chunk = min(HEAD_CHUNK_BYTES, vocab * hidden * host)
    return 3 * layer + 2 * head_chunk + min(acts, ACTIVATIONS_IN_RAM_BYTES) + logits + STREAM_OVERHEAD_BYTES


def prepared(src: StreamSource, work: Path, role: str):
    """A :class:`~.loading.PreparedModel` for a streamed input (what tokenizing and the report
    need).  A GGUF's tokenizer is rebuilt from its metadata into ``work/role`` (small files; the
    weights are never written)."""
    from .kinds import model_kind
    from .loading import PreparedModel
    from ..runtime import has_tokenizer

    folder = src.folder
    if src.gguf:
        from ..conversion.from_gguf import write_hf_tokenizer
        out = work / role
        out.mkdir(parents=True, exist_ok=True)
        write_hf_tokenizer(src.ck, src.config, out)
        folder = str(out)
    archs = src.config.get("architectures") or [src.config.get("model_type") or "?"]
    kind = model_kind(src.config, path=src.given)
    return PreparedModel(src.given, str(folder), src.config, kind, str(archs[0]), src.storage_dtype, src.n_params,
                         has_tokenizer(folder), False, role, src.dequantized)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class StreamedLayers:
    """Per-layer divergence gathered while streaming (what ``--localize`` reports)."""

    points: tuple                  # PointDiff, execution order
    threshold: float

    def report(self) -> LocalizeReport:
        return judged(self.points, self.threshold, "stream")


# --------------------------------------------------------------------------- the model side


def _torch_dtype(dtype: str):
    import torch
    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[dtype]


def host_item(item: int) -> int:
    """Bytes per element of what is held on the host in numpy (logits, the kept attention / MLP
    outputs, the read staging): the compute dtype's, or float32's for bfloat16."""
    return max(item, 4)


class _Model:
    """One model's skeleton on the meta device, its loader, and the streamed steps."""

    def __init__(self, src: StreamSource, dtype: str, device: str):
        import torch
        import transformers
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming

        from ..runtime import quiet_transformers
        from .kinds import model_kind

        self.src, self.dtype, self.device = src, dtype, device
        self.tdtype = _torch_dtype(dtype)
        self.npdtype = _NP_DTYPES[dtype]
        self.kind = model_kind(src.config, path=src.given)
        cls = getattr(transformers, self.kind.auto_class)
        try:
            with quiet_transformers():
                if src.folder is not None:
                    cfg = transformers.AutoConfig.from_pretrained(src.folder, local_files_only=True)
                    for key in ("quantization_config", "quantization"):
                        if src.dequantized is not None and hasattr(cfg, key):
                            delattr(cfg, key)    # the unquantized architecture, fed dequantized weights
                else:
                    c = dict(src.config)
                    cfg = transformers.AutoConfig.for_model(c.pop("model_type"), **c)
                with torch.device("meta"):
                    self.model = cls.from_config(cfg, attn_implementation="eager", dtype=self.tdtype,
                                                 **float64_kwargs(dtype))
        except (OSError, ValueError, KeyError, RuntimeError, ImportError, TypeError, AttributeError) as e:
            from ..runtime import first_line
            raise UnsupportedError(f"transformers could not build the model: {first_line(e)}",
                                   path=src.given) from None
        self.model.eval()
        self.config = self.model.config
        # Layers: the registry's layer pattern, as --localize finds them.
        self.points = hook_points(self.model, src.config)
        seen = {}
        for la, part, path, mod in self.points:
            if part == "output":
                seen[la] = (path, mod)
        self.layer_paths = [seen[i][0] for i in sorted(seen)]
        self.layers = [seen[i][1] for i in sorted(seen)]
        if sorted(seen) != list(range(len(seen))):
            raise ConfigError(f"decoder layers are not numbered 0..{len(seen) - 1}", path=src.given)
        self.embed = self.model.get_input_embeddings()
        self.head = self.model.get_output_embeddings() if self.kind.distribution else None
        if self.kind.distribution and self.head is None:
            raise UnsupportedError(f"{type(self.model).__name__} has no output embedding module; the head "
                                   "cannot be streamed in vocabulary chunks", path=src.given)
        mods = {m: n for n, m in self.model.named_modules()}
        self.embed_path = mods[self.embed]
        self.head_path = mods[self.head] if self.head is not None else None
        # transformers' own key conversion (renames, base-model prefix, fused experts)
        self.mapping = get_model_conversion_mapping(self.model)
        renamings = [m for m in self.mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in self.mapping if isinstance(m, WeightConverter)]
        self._group_keys(renamings, converters)
        self.returns_tuple = None       # the layers' return convention, learnt from the first real call

    # -- which checkpoint key belongs where ----------------------------------------------------
    def _group_keys(self, renamings, converters) -> None:
        from transformers.core_model_loading import rename_source_key
        meta_sd = self.model.state_dict()
        prefix = self.model.base_model_prefix
        self.groups: dict = {}          # layer index | "rest" | "embed" | "head" -> [checkpoint keys]
        self.model_key = {}
        self.key_dtype = {}
        self.unused = []
        embed_w = f"{self.embed_path}.weight"
        head_w = f"{self.head_path}.weight" if self.head_path else None
        head_b = f"{self.head_path}.bias" if self.head_path else None
        for key in self.src.keys():
            mk, _ = rename_source_key(key, renamings, converters, prefix, meta_sd)
            if mk not in meta_sd and key in meta_sd:
                mk, _ = rename_source_key(key, [], [], prefix, meta_sd)
            if mk not in meta_sd:
                self.unused.append(key)
                continue
            self.model_key[key] = mk
            self.key_dtype[key] = meta_sd[mk].dtype     # float32 where the model keeps a module so (MoE gates)
            if mk == embed_w:
                g = "embed"
            elif mk in (head_w, head_b):
                g = "head"
            else:
                g = next((i for i, p in enumerate(self.layer_paths) if mk.startswith(p + ".")), "rest")
            self.groups.setdefault(g, []).append(key)
        self.head_keys = {self.model_key[k].rsplit(".", 1)[1]: k for k in self.groups.get("head", [])}
        if self.head is not None and "weight" not in self.head_keys:
            embed = self.groups.get("embed")
            if embed and _tied(self.config):
                self.head_keys["weight"] = embed[0]     # tied: the head is the embedding matrix
            else:
                raise ConfigError(f"the checkpoint has no {head_w} (and the embeddings are not tied); the model "
                                  "would have a random head", path=self.src.given)
        if self.head is not None and getattr(self.head, "bias", None) is not None and "bias" not in self.head_keys:
            raise UnsupportedError(f"the head's bias ({head_b}) is stored under another name; the head cannot be "
                                   "streamed in vocabulary chunks", path=self.src.given)
        if not self.groups.get("embed"):
            raise ConfigError(f"the checkpoint has no {embed_w}", path=self.src.given)

    # -- materialising ------------------------------------------------------------------------
    def _tensor(self, arr: np.ndarray, dtype=None):
        """``arr`` on the device in ``dtype`` (default: the compute dtype); bfloat16 is rounded by
        torch from the float32 read, one tensor at a time."""
        import torch
        t = torch.from_numpy(np.ascontiguousarray(np.asarray(arr).astype(self.npdtype, copy=False)))
        t = t if self.device == "cpu" else t.to(self.device)
        return t.to(dtype or self.tdtype)

    def _init_buffers(self, modules) -> None:
        """Buffers the checkpoint does not store (rotary ``inv_freq``, position ids, causal-mask
        tables) initialised by the model's own ``_init_weights``, as ``from_pretrained`` does for
        a model built on the meta device.  Only the buffers are given storage here: the module's
        parameters stay on meta until loaded (an embedding module's weight is never allocated)."""
        import torch
        for m in modules:
            metas = [n for n, b in m._buffers.items() if b is not None and b.is_meta]
            if metas:
                for n in metas:
                    m._buffers[n] = torch.empty_like(m._buffers[n], device=self.device)
                with torch.no_grad():
                    self.model._init_weights(m)

    def load_group(self, group, modules, prefixes) -> None:
        """Load the checkpoint keys of ``group`` into the model (transformers' loader and key
        conversions) and check that every parameter under ``prefixes`` got a value."""
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig

        self._init_buffers(modules)
        # each tensor in the dtype of the parameter it loads into: a module the model keeps in
        # float32 (a MoE router's weight) is not rounded to bfloat16 on the way
        sd = {k: self._tensor(self.src.read(k), self.key_dtype.get(k)) for k in self.groups.get(group, [])}
        self.src.drop_cache()
        # dtype_plan: the modules the model keeps in float32 whatever the dtype (_keep_in_fp32_modules),
        # as from_pretrained loads them
        cfg = LoadStateDictConfig(device_map={"": self.device}, dtype=self.tdtype, weight_mapping=self.mapping,
                                  dtype_plan=self.model._get_dtype_plan(self.tdtype))
        from ..runtime import quiet_transformers
        with quiet_transformers():      # no "Loading weights" bar per layer
            info, _ = convert_and_load_state_dict_in_model(self.model, sd, cfg)
        del sd
        bad = sorted(str(x[0]) for x in info.mismatched_keys if any(str(x[0]).startswith(p) for p in prefixes))
        if bad:
            raise ConfigError(f"{self.src.config.get('architectures', ['?'])[0]} has wrongly shaped weight(s) "
                              f"{', '.join(bad[:3])}", path=self.src.given)
        missing = [n for p in prefixes for n, t in self._named(p) if t.is_meta]
        if missing:
            raise ConfigError(f"the model needs {len(missing)} weight(s) the checkpoint lacks ({', '.join(missing[:3])}"
                              f"{' ...' if len(missing) > 3 else ''}); transformers would initialise them randomly",
                              path=self.src.given)

    def _named(self, prefix: str):
        """(name, tensor) of the parameters and buffers under module path ``prefix`` ("" = the
        model minus its layers, embedding and head)."""
        if prefix:
            mod = self.model.get_submodule(prefix)
            return [(f"{prefix}.{n}", t) for n, t in list(mod.named_parameters()) + list(mod.named_buffers())]
        skip = tuple(p + "." for p in self.layer_paths + [self.embed_path] + ([self.head_path] if self.head_path else []))
        return [(n, t) for n, t in list(self.model.named_parameters()) + list(self.model.named_buffers())
                if not n.startswith(skip)]

    def load_rest(self) -> None:
        skip = set(self.layers) | {self.embed} | ({self.head} if self.head is not None else set())
        inside = set()
        for m in skip:
            inside.update(m.modules())
        rest = [m for m in self.model.modules() if m not in inside]
        self._init_buffers(rest + [self.embed] + ([self.head] if self.head is not None else []))
        self.load_group("rest", [], [""])

    def load_layer(self, i: int) -> None:
        self.load_group(i, list(self.layers[i].modules()), [self.layer_paths[i]])

    def free_layer(self, i: int) -> None:
        self.layers[i].to_empty(device="meta")

    # -- embedding ----------------------------------------------------------------------------
    def embed_sequences(self, sequences) -> list:
        """``inputs_embeds`` [1, T, H] per sequence, from the rows of the tokens that occur only."""
        import torch
        key = self.groups["embed"][0]
        ids = np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences]))
        rows = self.src.shape(key)[0]
        if ids.size and (ids[0] < 0 or ids[-1] >= rows):
            raise ConfigError(f"token id {int(ids[-1])} is beyond the embedding's {rows} rows", path=self.src.given)
        table = np.empty((ids.size,) + self.src.shape(key)[1:], dtype=self.npdtype)
        start = 0
        for run in np.split(np.arange(ids.size), np.nonzero(np.diff(ids) != 1)[0] + 1):
            if run.size:
                a = int(ids[run[0]])
                table[start:start + run.size] = self.src.read_rows(key, a, a + run.size)
                start += run.size
        w = self.embed.weight
        param = torch.nn.Parameter(self._tensor(table), requires_grad=False)
        self.embed.weight = param
        try:
            out = []
            with torch.no_grad():
                for s in sequences:
                    compact = torch.from_numpy(np.searchsorted(ids, np.asarray(s, dtype=np.int64)))[None]
                    out.append(self.embed(compact.to(self.device)))
        finally:
            self.embed.weight = w
        return out

    # -- the model's own forward, with the layers replaced ------------------------------------
    def _forward(self, inputs_embeds, layer_fn):
        """Run the model's forward with each layer's ``forward`` replaced by ``layer_fn(i, args,
        kwargs)``; returns the model output (None when the last layer raised _Stop)."""
        import torch
        saved = []
        for i, layer in enumerate(self.layers):
            saved.append(layer.__dict__.get("forward"))
            layer.forward = (lambda *a, _i=i, **k: layer_fn(_i, a, k))
        try:
            mask = torch.ones(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
            kw = dict(inputs_embeds=inputs_embeds, attention_mask=mask)
            if self.kind.generates:
                kw["use_cache"] = False
            return self.model(**kw)
        except _Stop:
            return None
        finally:
            for layer, f in zip(self.layers, saved):
                if f is None:
                    del layer.forward
                else:
                    layer.forward = f

    def layer_calls(self, inputs_embeds) -> tuple[object, list]:
        """What each layer is called with for this input: (layer 0's hidden states, per layer
        (args, kwargs) with the hidden states removed)."""
        calls: list = [None] * len(self.layers)
        first = {}

        def record(i, args, kwargs):
            kwargs = dict(kwargs)
            if args:
                h, args = args[0], tuple(args[1:])
            else:
                h = kwargs.pop("hidden_states")
            if i == 0:
                first["h"] = h
            calls[i] = (args, kwargs)
            if i == len(self.layers) - 1:
                raise _Stop
            return h          # the hidden states are not used by the recorders that follow
        self._forward(inputs_embeds, record)
        if any(c is None for c in calls):
            raise UnsupportedError(f"{type(self.model).__name__}'s forward did not call every decoder layer; "
                                   "it cannot be streamed", path=self.src.given)
        return first["h"], calls

    def run_layer(self, i: int, h, call):
        args, kwargs = call
        out = self.layers[i](h, *args, **kwargs)
        if self.returns_tuple is None:
            self.returns_tuple = isinstance(out, (tuple, list))
        return out[0] if isinstance(out, (tuple, list)) else out

    def tail(self, final_h, dummy, head_w=None, head_b=None, rows=None):
        """The model's forward after its layers (final norm, head chunk, logit post-processing),
        the layers replaced by a replay of ``final_h``.  Returns [R, C] (or [R, H] for encoders)."""
        last = len(self.layers) - 1

        def replay(i, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            h = final_h if i == last else h
            return (h,) if self.returns_tuple else h
        if self.head is not None:
            chunk = self._chunk_head
            chunk.weight, chunk.bias, chunk.rows = head_w, head_b, rows
            out = self._forward(dummy, replay)
            chunk.weight = chunk.bias = None
            return out.logits[0]
        out = self._forward(dummy, replay)
        h = out.last_hidden_state[0] if hasattr(out, "last_hidden_state") else out[0][0]
        return h if rows is None else h[rows]

    def install_chunk_head(self) -> None:
        parent_path, _, name = self.head_path.rpartition(".")
        parent = self.model.get_submodule(parent_path) if parent_path else self.model
        self._chunk_head = _chunk_head()
        setattr(parent, name, self._chunk_head)

    def head_rows(self) -> int:
        return self.src.shape(self.head_keys["weight"])[0]

    def read_head(self, start: int, stop: int):
        w = self._tensor(self.src.read_rows(self.head_keys["weight"], start, stop))
        b = self.head_keys.get("bias")
        return w, (self._tensor(self.src.read(b)[start:stop]) if b else None)


def _tied(config) -> bool:
    get = getattr(config, "get_text_config", None)
    text = get() if get else config
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def _chunk_head():
    """A module standing in for the model's output head: one chunk of its rows (``weight``,
    ``bias``), applied to the positions wanted (``rows``).  Whatever the model's forward does to
    the head's output afterwards (soft-capping, scaling) is elementwise, so it applies per chunk."""
    import torch

    class ChunkHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = self.bias = self.rows = None

        def forward(self, h):
            if self.rows is not None:
                h = h[:, self.rows]
            w, b = self.weight, self.bias
            if w.dtype.itemsize >= 4:
                return torch.nn.functional.linear(h, w, b)
            # bfloat16: float32 products and sums of the bf16 values, float32 logits (the statistics
            # then see no bf16 rounding of the logits), in blocks of rows so that the float32 copy
            # of the weights stays one head chunk (the pipeline's last rank holds the head whole)
            h = h.float()
            out = torch.empty((*h.shape[:-1], w.shape[0]), dtype=torch.float32, device=h.device)
            step = max(1, HEAD_CHUNK_BYTES // (int(w.shape[1]) * 4))
            for a in range(0, int(w.shape[0]), step):
                out[..., a:a + step] = torch.nn.functional.linear(
                    h, w[a:a + step].float(), None if b is None else b[a:a + step].float())
            return out
    return ChunkHead()


# --------------------------------------------------------------------------- the streamed pair


class _Hidden:
    """Hidden states of every sequence for one model: torch tensors on the device, or views of a
    memory-mapped file in ``tmp_dir`` when all of them would exceed the in-RAM allowance."""

    def __init__(self, first: list, spill_dir: str | None):
        import torch
        self.spill = None
        if spill_dir is not None:
            total = sum(int(h.shape[1]) for h in first)
            width = int(first[0].shape[-1])
            # bfloat16: its bit patterns in a uint16 file, viewed back as bfloat16 by torch
            np_dtype = {torch.float32: np.float32, torch.float64: np.float64, torch.bfloat16: np.uint16}[first[0].dtype]
            fd, path = tempfile.mkstemp(prefix="hidden-", suffix=".bin", dir=spill_dir)
            os.close(fd)
            self.spill = np.memmap(path, dtype=np_dtype, mode="w+", shape=(total, width))
            self.h, at = [], 0
            for h in first:
                t = int(h.shape[1])
                view = torch.from_numpy(self.spill[at:at + t]).view(first[0].dtype)
                view.copy_(h[0])
                self.h.append(view[None])
                at += t
        else:
            self.h = list(first)

    def __getitem__(self, s):
        return self.h[s]

    def __setitem__(self, s, value):
        if self.spill is not None:
            self.h[s].copy_(value)
        else:
            self.h[s] = value

    def __len__(self):
        return len(self.h)


class StreamedPair:
    """Iterating yields ``(seq_index, ref_out, cand_out)``: numpy arrays ``[len(rows[i]), V]`` (logits;
    ``[len(rows[i]), H]`` last hidden states for encoders) in the compute dtype (float32 for bfloat16).  The layers run
    on the first ``next()``; afterwards ``.layers`` holds the per-layer divergence
    (:class:`StreamedLayers`) and ``.localize()`` the :class:`LocalizeReport`."""

    def __init__(self, reference, candidate, sequences, *, rows=None, dtype="float32", device="cpu",
                 progress=None, tmp_dir=None, threshold=None, single=False):
        _check(sequences, rows, dtype)
        self._args = (reference, candidate)
        self.sequences = [list(map(int, s)) for s in sequences]
        self.rows = rows
        self.dtype, self.device, self.progress, self.tmp_dir = dtype, device, progress, tmp_dir
        self.threshold = DEFAULT_THRESHOLDS.get(dtype, DEFAULT_THRESHOLDS["float32"]) if threshold is None \
            else float(threshold)
        self.single = single
        self.layers: StreamedLayers | None = None
        self.warnings: list[str] = []
        self.models: tuple = ()

    def localize(self) -> LocalizeReport:
        if self.layers is None:
            raise RuntimeError("iterate the StreamedPair first")
        return self.layers.report()

    def __iter__(self):
        import torch
        with torch.no_grad(), tempfile.TemporaryDirectory(prefix="ckpt-surgeon-stream-", dir=self.tmp_dir) as work:
            yield from self._run(work)

    # --------------------------------------------------------------------------------------
    def _run(self, work: str):
        from ..runtime import quiet_transformers
        srcs = [open_source(a, role=r) for a, r in zip(self._args, ("reference", "candidate")) if a is not None]
        try:
            with quiet_transformers():
                models = [_Model(s, self.dtype, self.device) for s in srcs]
            self.models = tuple(models)
            for m in models:
                if m.unused:
                    self.warnings.append(f"{m.src.given}: {len(m.unused)} tensor(s) not used by "
                                         f"{type(m.model).__name__} ({', '.join(m.unused[:3])}"
                                         f"{' ...' if len(m.unused) > 3 else ''})")
            if len(models) == 2:
                _same_structure(*models)
            yield from self._stream(models, work)
        finally:
            for s, a in zip(srcs, self._args):
                if not isinstance(a, StreamSource):
                    s.close()

    def _stream(self, models, work):
        for m in models:
            m.load_rest()
        hidden, calls_by_len = self._embed(models, work)
        # The attention / MLP outputs of the reference are kept for every sequence while the
        # candidate's layer runs: only when that fits the activations allowance (a corpus of
        # many long chunks is compared on the layer outputs alone, and the report lists only those).
        width = int(hidden[0][0].shape[-1])
        positions = sum(int(h.shape[1]) for h in hidden[0].h)
        parts = 2 * positions * width * host_item(hidden[0][0].element_size()) <= ACTIVATIONS_IN_RAM_BYTES
        points = [(k, la, part, path) for k, (la, part, path, _) in enumerate(models[0].points)
                  if parts or part == "output"]
        accs = {k: DiffAccumulator() for k, *_ in points}
        n_layers = len(models[0].layers)
        bar = progress_bar(self.progress, total=n_layers, desc="layers", unit="layer")
        for i in range(n_layers):
            self._layer(i, models, hidden, calls_by_len, parts, accs)
            bar.update(1)
        bar.close()
        if len(models) == 2:
            self.layers = StreamedLayers(tuple(
                PointDiff(la, part, path, accs[k].max_abs, accs[k].rel(), accs[k].rel() > self.threshold)
                for k, la, part, path in points), self.threshold)
        yield from self._tails(models, hidden)

    def _embed(self, models, work) -> tuple[list, list]:
        """Every sequence embedded once per model, and what each layer is called with learnt per sequence
        length: (the hidden states per model, spilled under ``work`` past the activations allowance on cpu;
        per model, sequence length -> the layers' calls)."""
        hidden, calls_by_len = [], []
        for m in models:
            embeds = m.embed_sequences(self.sequences)
            firsts, by_len = [], {}
            for e in embeds:
                t = int(e.shape[1])
                h0, calls = m.layer_calls(e)
                by_len.setdefault(t, calls)
                firsts.append(h0)
            total = 2 * sum(int(f.shape[1]) * int(f.shape[2]) for f in firsts) * firsts[0].element_size()
            spill = work if total > ACTIVATIONS_IN_RAM_BYTES and self.device == "cpu" else None
            hidden.append(_Hidden(firsts, spill))
            calls_by_len.append(by_len)
        return hidden, calls_by_len

    def _layer(self, i: int, models, hidden, calls_by_len, parts: bool, accs: dict) -> None:
        """Layer ``i`` of each model run on every sequence (``hidden`` updated in place); with two models the
        hook points' differences added to ``accs`` (the reference's parts kept while the candidate's run)."""
        parts_ref: list = []
        for side, m in enumerate(models):
            m.load_layer(i)
            recs = _PartRecorder(m.points, i, parts)
            try:
                for s in range(len(self.sequences)):
                    recs.start()
                    h = hidden[side][s]
                    out = m.run_layer(i, h, calls_by_len[side][int(h.shape[1])][i])
                    if len(models) == 2:
                        got = recs.got()
                        if side == 0:
                            parts_ref.append(got)
                        else:
                            for k, arr in got.items():
                                accs[k].add(parts_ref[s][k], arr)
                            accs[recs.output_index].add(_np(hidden[0][s][0]), _np(out[0]))
                    hidden[side][s] = out
            finally:
                recs.close()
                m.free_layer(i)

    def _tails(self, models, hidden):
        import torch
        seqs = self.sequences
        rows = self.rows if self.rows is not None else [None] * len(seqs)
        n_rows = [len(seqs[s]) if r is None else len(r) for s, r in enumerate(rows)]
        item = host_item(_ITEMSIZE[self.dtype])      # the logits and the head's read staging are float32 for bf16
        m0 = models[0]
        if m0.head is None:          # encoder: the last hidden states, one forward per sequence
            for s in range(len(seqs)):
                outs = [self._tail_one(m, hidden[k][s], rows[s]) for k, m in enumerate(models)]
                yield (s, *[_np(o) for o in outs])
            return
        for m in models:
            m.install_chunk_head()
        vocab = m0.head_rows()
        if len(models) == 2 and models[1].head_rows() != vocab:
            vocab = max(vocab, models[1].head_rows())
        widths = [m.head_rows() for m in models]
        chunk = max(1, HEAD_CHUNK_BYTES // (int(hidden[0][0].shape[-1]) * item))
        # groups of sequences whose logits (both models) fit LOGITS_GROUP_BYTES
        groups, cur, size = [], [], 0
        for s in range(len(seqs)):
            b = len(models) * n_rows[s] * vocab * item
            if cur and size + b > LOGITS_GROUP_BYTES:
                groups.append(cur)
                cur, size = [], 0
            cur.append(s)
            size += b
        if cur:
            groups.append(cur)
        for group in groups:
            outs = {(k, s): np.empty((n_rows[s], widths[k]), dtype=_NP_DTYPES[self.dtype])
                    for k in range(len(models)) for s in group}
            for k, m in enumerate(models):
                for a in range(0, widths[k], chunk):
                    b = min(widths[k], a + chunk)
                    w, bias = m.read_head(a, b)
                    for s in group:
                        h = hidden[k][s]
                        dummy = torch.zeros_like(h)
                        r = None if rows[s] is None else torch.as_tensor(np.asarray(rows[s], dtype=np.int64),
                                                                         device=h.device)
                        outs[(k, s)][:, a:b] = _np(m.tail(h, dummy, w, bias, r))
                    del w, bias
            for s in group:
                yield (s, *[outs.pop((k, s)) for k in range(len(models))])

    def _tail_one(self, m, h, rows):
        import torch
        r = None if rows is None else torch.as_tensor(np.asarray(rows, dtype=np.int64), device=h.device)
        return m.tail(h, torch.zeros_like(h), rows=r)


def _np(t) -> np.ndarray:
    """A tensor as a numpy array: bfloat16 (which numpy lacks) widened to float32, exactly."""
    t = t.detach().cpu()
    return (t.float() if t.is_floating_point() and t.dtype.itemsize < 4 else t).numpy()


class _PartRecorder:
    """Forward hooks on one layer's attention and MLP modules (the non-"output" hook points of
    --localize): their output for the sequence being run."""

    def __init__(self, points, layer: int, parts: bool = True):
        self.handles, self._got = [], {}
        self.output_index = None
        for k, (la, part, _, mod) in enumerate(points):
            if la != layer:
                continue
            if part == "output":
                self.output_index = k
            elif parts:
                self.handles.append(mod.register_forward_hook(self._hook(k)))

    def _hook(self, k):
        def fn(_module, _inp, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            self._got[k] = _np(t[0])
        return fn

    def start(self):
        self._got = {}

    def got(self) -> dict:
        return dict(self._got)

    def close(self):
        for h in self.handles:
            h.remove()


def _same_structure(a: _Model, b: _Model) -> None:
    pa = [(la, part) for la, part, *_ in a.points]
    pb = [(la, part) for la, part, *_ in b.points]
    if pa != pb:
        raise ConfigError(f"the models have different layer structures ({len(a.layers)} vs {len(b.layers)} layers); "
                          "they cannot be streamed side by side", path=b.src.given)
    if a.kind != b.kind:
        raise ConfigError(f"reference is a {a.kind.name} but candidate is a {b.kind.name}; nothing comparable",
                          path=b.src.given)


def _check(sequences, rows, dtype) -> None:
    if dtype not in STREAM_DTYPES:
        raise CkptError(f"layer streaming computes in {', '.join(STREAM_DTYPES[:-1])} or {STREAM_DTYPES[-1]}, not {dtype!r}")
    if not sequences or not all(len(s) for s in sequences):
        raise CkptError("sequences must be a non-empty list of non-empty token id lists")
    if rows is not None:
        if len(rows) != len(sequences):
            raise CkptError(f"rows has {len(rows)} entries for {len(sequences)} sequences")
        for i, (r, s) in enumerate(zip(rows, sequences)):
            r = np.asarray(r)
            if r.size and (r.min() < 0 or r.max() >= len(s)):
                raise CkptError(f"rows[{i}] holds a position outside sequence {i} (length {len(s)})")


# --------------------------------------------------------------------------- API


def stream_pair(reference, candidate, sequences: list[list[int]], *, rows: list[np.ndarray] | None = None,
                dtype: str = "float32", device: str = "cpu", progress=None, tmp_dir=None,
                threshold: float | None = None) -> StreamedPair:
    """Run ``reference`` and ``candidate`` layer by layer on ``sequences`` (token ids, batch 1 each).

    ``reference`` / ``candidate``: a path (HF folder, ``.safetensors`` file, ``.gguf``), a Hub id,
    or a :class:`StreamSource` from :func:`open_source`.  ``rows[i]``: the positions of sequence
    ``i`` whose logits are wanted (None = all).  ``dtype``: ``float32`` | ``float64`` | ``bfloat16``
    (layers and hidden states in bf16, the head in float32: float32 logits).
    ``tmp_dir``: where hidden states too large for RAM are memory-mapped.  ``threshold``: relative
    divergence that marks a layer (default per dtype, as ``--localize``).

    Iterating the result yields ``(seq_index, ref_logits, cand_logits)`` in sequence order;
    ``.layers`` then holds the per-layer divergence."""
    return StreamedPair(reference, candidate, sequences, rows=rows, dtype=dtype, device=device, progress=progress,
                        tmp_dir=tmp_dir, threshold=threshold)


def stream_logits(source, sequences: list[list[int]], *, rows: list[np.ndarray] | None = None,
                  dtype: str = "float32", device: str = "cpu", progress=None, tmp_dir=None):
    """One model streamed: yields ``(seq_index, logits)`` (see :func:`stream_pair`)."""
    pair = StreamedPair(source, None, sequences, rows=rows, dtype=dtype, device=device, progress=progress,
                        tmp_dir=tmp_dir, single=True)
    for s, out in pair:
        yield s, out


__all__ = ["stream_pair", "stream_logits", "StreamedPair", "StreamedLayers", "StreamSource", "open_source",
           "stream_need_from_sizes", "rethreshold", "STREAM_DTYPES"]
