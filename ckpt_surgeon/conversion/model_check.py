"""Check a tensor set against the model transformers builds from a config (on the meta device).

Both converters call :func:`check_tensors`: a tensor the model does not have, a parameter the
checkpoint lacks, or a shape that differs is an error, never something ``from_pretrained``
would later initialise at random with only a warning.

Building the model needs torch + transformers, whose imports cost seconds of pure-Python work.
:func:`expected_tensors_in_subprocess` does it in a child process (``python -m
ckpt_surgeon.conversion.model_check``: config JSON on stdin, ``{name: shape}`` JSON on stdout), so
the converter can stream tensors on one core while the model is built on the other, without the
two fighting over the GIL.  That child is the critical path of a GGUF -> HF conversion, so it
imports no optional package the model build does not need (:data:`_HIDDEN_WHILE_IMPORTING`) and
leaves with ``os._exit`` once its answer is written, skipping torch's interpreter teardown.
"""
from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from ..errors import CkptError, ConfigError
from ..quiet import quiet_transformers


def expected_tensors(config, *, by_architecture: bool = False) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of every tensor a checkpoint for ``config`` must hold.

    The model is transformers' causal-LM class for the model type, or with ``by_architecture`` the class the
    config's ``architectures`` names where transformers has it (an encoder's ``BertModel``, a masked LM's
    ``DistilBertForMaskedLM``: what llama.cpp's converter registers and the checkpoint holds).

    ``config`` is a ``PretrainedConfig`` or a dict with ``model_type``.  Parameters shared by
    tying (``lm_head.weight`` when ``tie_word_embeddings``) are listed once, under the first
    name (``named_parameters()``'s de-duplication); persistent buffers are included.  Names are
    the ones a checkpoint stores: transformers 5 fuses some weights when it loads (MoE experts
    into one ``experts.gate_up_proj``) and splits them back when it saves
    (``core_model_loading.revert_weight_conversion``, which ``save_pretrained`` calls); the
    same reversal is applied here, on the meta tensors.
    """
    return _checkpoint_shapes(_meta_model(config, by_architecture=by_architecture))


def expected_tensors_and_spellings(config, *, by_architecture: bool = False) -> tuple[dict, Spellings, dict]:
    """:func:`expected_tensors`, from the same model the other spellings of its names (:class:`Spellings`), and the
    names of the tensors the model keeps as integers (DeepSeek-V4's hash-routing table) -> their torch dtype."""
    model = _meta_model(config, by_architecture=by_architecture)
    tensors = _checkpoint_tensors(model)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    integers = {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()
                if not v.dtype.is_floating_point and not v.dtype.is_complex}
    return shapes, Spellings(model, shapes), integers


def _meta_model(config, *, by_architecture: bool = False):
    """The model transformers builds for ``config`` (a ``PretrainedConfig`` or a dict with
    ``model_type``), on the meta device: shapes only, no memory.  Its class: see :func:`expected_tensors`."""
    import torch
    import transformers

    if isinstance(config, dict):
        # a deep copy: transformers' config classes standardise nested dicts in place (rope_parameters
        # gains partial_rotary_factor), and the caller may write this dict as config.json afterwards
        cfg = copy.deepcopy(config)
        # as config.json read by from_pretrained: transformers writes inf / nan as {"__float__": "Infinity"}
        # (Mamba 2's time_step_limit), which its config classes' field checks refuse undecoded
        decode = getattr(transformers.PreTrainedConfig, "_decode_special_floats", None)
        cfg = decode(cfg) if decode is not None else cfg
        model_type = cfg.pop("model_type")
        config = transformers.AutoConfig.for_model(model_type, **cfg)
    names = (getattr(config, "architectures", None) or []) if by_architecture else []
    named = getattr(transformers, names[0], None) if names else None
    with quiet_transformers(), torch.device("meta"):
        if isinstance(named, type) and issubclass(named, transformers.PreTrainedModel):
            # a text-only class named by a multimodal release's outer config (Dots3NoteForCausalLM under
            # Dots3NoteConfig, whose text keys the release stores flat): built from the text config, the one its
            # config_class is, as AutoModelForCausalLM.from_config builds it
            own = getattr(named, "config_class", None)
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            if isinstance(own, type) and not isinstance(config, own) and isinstance(text, own):
                config = text
            return named._from_config(config)
        return transformers.AutoModelForCausalLM.from_config(config)


def rotary_widths(model) -> list[int]:
    """The widths the model's rotary embeddings rotate, 2 x each ``inv_freq`` buffer's length (one
    frequency per pair of dims): how the class itself read head_dim and partial_rotary_factor
    (modeling_llama's default RoPE ignores a partial_rotary_factor that modeling_phi's applies)."""
    return sorted({2 * int(b.shape[-1]) for n, b in model.named_buffers() if n.rsplit(".", 1)[-1] == "inv_freq"})


def _checkpoint_shapes(model) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of the tensors a checkpoint of ``model`` stores (see :func:`expected_tensors`)."""
    return {k: tuple(v.shape) for k, v in _checkpoint_tensors(model).items()}


def _checkpoint_tensors(model, prefix: str = "") -> dict:
    """``name -> meta tensor`` (shape and dtype) of the tensors a checkpoint of ``model`` stores; with ``prefix``, of
    a checkpoint saved without that leading prefix (:meth:`Spellings.unprefixed`)."""
    from transformers.core_model_loading import revert_weight_conversion

    unique = {n for n, _ in model.named_parameters()}
    aliases = {n for n, _ in model.named_parameters(remove_duplicate=False)} - unique
    state = {k.removeprefix(prefix): v for k, v in model.state_dict().items() if k not in aliases}
    return revert_weight_conversion(model, state)


def checkpoint_spellings(model, names, rename=None) -> dict[str, str]:
    """``name -> other spelling`` for the checkpoint ``names`` of ``model`` (:func:`_checkpoint_shapes`) that
    transformers' load only renames (no converter fuses or splits them) into a parameter key spelled otherwise,
    and that key read as a checkpoint name lands on the same parameter: two spellings ``from_pretrained`` reads
    alike.  Which one a checkpoint holds is the writer's choice: transformers' save writes the first (its reversal
    of the load renames), a Hub release may hold the other (Kimi-Linear's dense MLP: ``mlp.gate_proj`` on the Hub,
    ``block_sparse_moe.gate_proj`` from save_pretrained)."""
    rename = rename or checkpoint_key_renamer(model)
    out = {}
    for name in names:
        key, pattern = rename(name)
        if pattern is None and key != name and rename(key) == (key, None):
            out[name] = key
    return out


class Spellings(dict):
    """``name -> other spelling`` of a checkpoint's ``names`` (:func:`checkpoint_spellings`: transformers' own key),
    and, through :meth:`among`, the spellings a list of candidate names offers (llama.cpp's tensor map: HY-V4's
    Hub names, which are neither transformers' save spelling nor its key)."""

    def __init__(self, model, names):
        self._rename = checkpoint_key_renamer(model)
        super().__init__(checkpoint_spellings(model, names, self._rename))
        self._names, self._model = list(names), model

    def alternatives(self, name: str) -> list[str]:
        """Other spellings transformers loads into the same parameter as ``name`` (renamed only, no converter): its key
        with transformers' reversed renames (those ``save_pretrained`` applies, in its order) applied in part, fewest
        left out first.  Where a reversed rename is wider than the rename it undoes (DeepSeek-V4's ``.norm.`` ->
        ``.kv_norm.`` reversed turns the attention's own ``attn.kv_norm`` into ``attn.norm`` too), the spelling a
        release has is one of these."""
        from transformers.core_model_loading import WeightRenaming

        from ..arch.derive.renames import conversions
        key, pattern = self._rename(name)
        if pattern is not None:
            return []
        prefix = (getattr(self._model, "base_model_prefix", "") or "") + "."
        start = key if name.startswith(prefix) or not key.startswith(prefix) else key[len(prefix):]
        rules = [c.reverse_transform() for c in conversions(self._model)[::-1] if isinstance(c, WeightRenaming)]
        found: dict[str, int] = {}

        def walk(i: int, cur: str, left_out: int) -> None:
            if i == len(rules):
                found[cur] = min(found.get(cur, left_out), left_out)
                return
            new, _ = rules[i].rename_source_key(cur)
            walk(i + 1, new, left_out)
            if new != cur:
                walk(i + 1, cur, left_out + 1)
        walk(0, start, 0)
        return sorted((c for c in found if c != name and self._rename(c) == (key, None)), key=lambda c: (found[c], c))

    def unprefixed(self, prefix: str) -> dict[str, str]:
        """``name -> spelling`` in a checkpoint of the model saved without ``prefix`` (its base-model prefix: a release
        that has none, DeepSeek-V4's): transformers' own save (``revert_weight_conversion``) of the state dict with
        the prefix taken off, whose reversed renames anchored at the start of a name (``^embed``) then apply.  Each
        spelling is paired with the name it stands for: the name with the prefix, or the name transformers loads
        into the same parameter."""
        names, by_key = set(self._names), {}
        for n in self._names:
            key, pattern = self._rename(n)
            if pattern is None:
                by_key[key] = n
        out = {}
        for b in _checkpoint_tensors(self._model, prefix):
            key, pattern = self._rename(b)
            n = prefix + b if prefix + b in names else (by_key.get(key) if pattern is None else None)
            if n is not None and n != b:
                out[n] = b
        return out

    def among(self, candidates) -> dict[str, str]:
        """``name -> candidate`` for each name a candidate also spells: transformers' load only renames both (no
        converter) into the same parameter.  Where several do, transformers' own key if it is one of them, else the
        first in sorted order (they differ only in the name the HF folder shows)."""
        by_key: dict[str, list] = {}
        for c in candidates:
            key, pattern = self._rename(c)
            if pattern is None:
                by_key.setdefault(key, []).append(c)
        out = {}
        for name in self._names:
            key, pattern = self._rename(name)
            options = sorted(c for c in by_key.get(key, ()) if c != name) if pattern is None else []
            if options:
                out[name] = key if key in options else options[0]
        return out


def checkpoint_key_renamer(model):
    """``name -> (key in the model's state dict, converter pattern or None)``: where transformers'
    ``from_pretrained`` puts a checkpoint tensor of that name (transformers 5 renames keys at load:
    the legacy gamma/beta spellings, the per-model conversion mapping that fuses MoE experts and
    such, and the base-model prefix added or stripped).  One implementation for the project:
    :func:`ckpt_surgeon.arch.derive.renames.key_renamer`."""
    from ..arch.derive.renames import key_renamer
    return key_renamer(model)


def load_keys_report(config: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """What ``from_pretrained`` of the class ``config`` names (``architectures[0]``) would do with
    a checkpoint of these tensor ``shapes``, without reading a byte: ``missing`` (weights of the
    model no tensor fills: initialised at random), ``unexpected`` (tensors with no place in the
    model: dropped) and ``mismatched`` (``[name, file shape, model shape]``), after transformers'
    own rules for what may be missing or extra (the class's ``_keys_to_ignore_on_load_missing`` /
    ``_unexpected`` and its extra patterns: ``model._adjust_missing_and_unexpected_keys``), tied
    weights (filled by tying, not at random) and non-persistent buffers (never in a state dict).
    ``{"skipped": reason}`` where the class cannot be built here."""
    import torch
    import transformers
    from transformers.utils.loading_report import LoadStateDictInfo

    cls_name = (config.get("architectures") or [None])[0]
    cls = getattr(transformers, cls_name, None) if isinstance(cls_name, str) else None
    if cls is None or not hasattr(cls, "from_pretrained"):
        return {"skipped": f"transformers {transformers.__version__} has no class {cls_name!r} (config.json "
                           "architectures)" if cls_name else "config.json names no class (architectures)"}
    from huggingface_hub.errors import StrictDataclassError

    cfg = dict(config)
    try:
        with quiet_transformers():
            conf = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
            with torch.device("meta"):
                model = cls(conf)
    except (ValueError, KeyError, TypeError, RuntimeError, AttributeError, StrictDataclassError) as e:
        # transformers 5 validates config fields; its message spans lines, joined into one
        return {"skipped": f"transformers cannot build {cls_name} from config.json ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})"}
    meta = model.state_dict()
    rename = checkpoint_key_renamer(model)
    info = LoadStateDictInfo(missing_keys=set(meta), unexpected_keys=set(), mismatched_keys=set(),
                             conversion_errors={}, error_msgs=[], skipped_pp_keys=set())
    mismatched = []
    for name, shape in shapes.items():
        key, pattern = rename(name)
        if key not in meta:
            info.unexpected_keys.add(name)
            continue
        info.missing_keys.discard(key)
        if pattern is None and tuple(shape) != tuple(meta[key].shape):
            mismatched.append([name, list(shape), list(meta[key].shape)])
    model._adjust_missing_and_unexpected_keys(info)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    return {"class": cls_name, "missing": sorted(info.missing_keys - tied), "unexpected": sorted(info.unexpected_keys),
            "mismatched": sorted(mismatched)}


def load_keys_report_cached(config: dict, shapes: dict[str, tuple[int, ...]]) -> dict:
    """:func:`load_keys_report`, answered from :mod:`.answer_cache` when this config and tensor
    set were checked before with this transformers release (then neither torch nor transformers
    is imported; the answer carries ``"cached": True``).  A failure to build is raised, not kept."""
    from . import answer_cache as C
    key = C.answer_path("load_keys", config.get("model_type"),
                        {"config": C.config_inputs(config), "shapes": {n: list(s) for n, s in shapes.items()}})
    hit = C.load(key)
    if hit is not None:
        return dict(hit, cached=True)
    got = load_keys_report(config, shapes)
    C.store(key, got)
    return got


def expected_tensors_or_error(config, *, path: str | None, what: str = "this config") -> dict[str, tuple[int, ...]]:
    """:func:`expected_tensors`, with transformers' own failures on config values it cannot build
    from (an unknown activation name, a negative size) as one ConfigError line."""
    try:
        return expected_tensors(config)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ConfigError(f"transformers cannot build a model from {what} ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})", path=path) from None


class ExpectedTensors:
    """A ``python -m ckpt_surgeon.conversion.model_check`` child.

    Started before the config is known, so that it imports torch and transformers while the
    caller reads the source; :meth:`submit` hands it the config, :meth:`result` waits for the
    ``{name: shape}`` answer, :meth:`kill` ends it when the conversion fails first.
    """

    def __init__(self, path: str | None = None, args: tuple = ()):
        self.path = path
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen([sys.executable, "-m", "ckpt_surgeon.conversion.model_check", *args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=env, text=True)
        self._payload: str | None = None

    def submit(self, config: dict) -> None:
        self._payload = json.dumps(config)

    def answer(self, key: str, what: str) -> dict:
        """The child's JSON answer, which must hold ``key``; else a ConfigError saying ``what`` failed."""
        if self._payload is None:
            raise RuntimeError("submit(config) first")
        out, err = self._proc.communicate(self._payload)
        try:
            got = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except json.JSONDecodeError:
            got = {}
        if self._proc.returncode != 0 or key not in got:
            why = got.get("error") or (err.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(f"{what} ({why})", path=self.path)
        return got

    def result(self) -> dict[str, tuple[int, ...]]:
        got = self.answer("shapes", "transformers cannot build a model from the converted config")
        return {k: tuple(v) for k, v in got["shapes"].items()}

    def kill(self) -> None:
        """End the child (idempotent).  Only ``wait()`` here: the gate's thread may be inside
        :meth:`result`'s ``communicate`` on the same pipes, which returns once the child is gone;
        a second ``communicate`` from this thread would race it for the pipes."""
        if self._proc.poll() is None:
            try:
                self._proc.kill()
            except ProcessLookupError:      # exited between poll and kill
                pass
        self._proc.wait()


class _InProcess:
    """Same interface as :class:`ExpectedTensors`, for a process that has imported transformers already."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._config: dict | None = None

    def submit(self, config: dict) -> None:
        self._config = config

    def result(self) -> dict[str, tuple[int, ...]]:
        return expected_tensors_or_error(self._config, path=self.path, what="the converted config")

    def kill(self) -> None:
        pass


def _in_process() -> bool:
    """torch and transformers' model machinery are imported here already: building a model in
    this process is cheaper than starting a new one."""
    return "transformers.modeling_utils" in sys.modules and "torch" in sys.modules


def _llama3_rope_freqs(config) -> list | None:
    """llama.cpp's ``rope_freqs.weight`` values for a llama3-scaled RoPE (computed here, where torch
    is loaded anyway; float32 values survive JSON exactly), else None."""
    from ..arch.rope import full_attention_rope
    rp = full_attention_rope(getattr(config, "rope_parameters", None))
    if rp.get("rope_type") != "llama3":
        return None
    from .rope_llama3 import llama3_rope_factors
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    try:
        return [float(v) for v in llama3_rope_factors(rp.get("rope_theta", 10000.0), int(dim), rp)]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None          # transformers validates these keys; a config it let through unusable stays refused


def declared_config_keys(config_class) -> list[str] | None:
    """The top-level config keys ``config_class`` declares: the fields a default instance saves
    (``to_dict()``) and its ``attribute_map`` aliases (GPT-2's ``hidden_size`` for ``n_embd``).
    Any other key in config.json is kept by transformers as a plain attribute that the model class
    reads only where its code asks for it by name (:data:`.names.UNDECLARED_READ`).  None when the
    class cannot be instantiated with its defaults (nothing is then filtered)."""
    try:
        with quiet_transformers():
            keys = set(config_class().to_dict())
    except Exception:  # noqa: BLE001 - a class without usable defaults: no filtering, as before
        return None
    return sorted(keys | set(getattr(config_class, "attribute_map", None) or {}))


def probe_folder(folder: str) -> dict:
    """What transformers makes of an HF folder, as JSON-able data (one answer, so that a child
    process can give all of it): ``config`` (``AutoConfig``'s ``to_dict()``, defaults filled in)
    and ``config_class`` (``config_keys``: :func:`declared_config_keys`) or ``config_error``; ``tokenizer_json`` (:func:`~.tokenizer.effective_tokenizer_json`); and
    ``shapes`` (:func:`expected_tensors`) and ``rotary_widths`` (:func:`rotary_widths`) or ``shapes_error``."""
    import transformers
    from huggingface_hub.errors import StrictDataclassError

    from .tokenizer import effective_tokenizer_json
    try:
        with quiet_transformers():
            config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, OSError, TypeError, AttributeError, StrictDataclassError) as e:
        # transformers 5 validates field types (huggingface_hub's strict dataclasses): its message
        # spans lines, joined here into the one line the CLI prints.  AttributeError: a config.json
        # setting a read-only property (FalconConfig's head_dim, derived from hidden_size / heads)
        return {"config_error": " ".join(str(e).split())[:300]}
    out: dict = {"config": config.to_dict(), "config_class": type(config).__name__,
                 "config_keys": declared_config_keys(type(config)),
                 "tokenizer_json": effective_tokenizer_json(folder)}
    rope = _llama3_rope_freqs(config)
    if rope is not None:
        out["rope_freqs"] = rope
    # The tokenizer object is gone by now; collect it before the model classes are imported, so
    # that their memory reuses its pages instead of adding to the peak.
    gc.collect()
    try:
        model = _meta_model(config)
        out["shapes"] = {k: list(v) for k, v in _checkpoint_shapes(model).items()}
        out["rotary_widths"] = rotary_widths(model)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:   # as expected_tensors_or_error
        out["shapes_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return out


def probe_folder_isolated(folder: str, path: str | None = None) -> dict:
    """:func:`probe_folder` in a child process (the one :class:`ExpectedTensors` starts), unless
    this process has imported torch and transformers already.

    Why a child: transformers with torch is ~250 MB resident, a Qwen2 tokenizer built by
    ``AutoTokenizer`` ~170 MB more and the model classes ~130 MB: all of it is needed for a few
    seconds, to answer three questions, and a process that ends gives it all back, so the
    converter that streams the tensors afterwards stays small.
    """
    if _in_process():
        return probe_folder(folder)
    child = ExpectedTensors(path, args=("--probe", str(folder)))
    child._payload = ""
    try:
        return child.answer("probe", "transformers cannot read this folder")["probe"]
    finally:
        child.kill()


def probe_folder_cached(folder: str, path: str | None = None, *, isolate: bool = True) -> dict:
    """:func:`probe_folder` (``isolate``: :func:`probe_folder_isolated`), answered from
    :mod:`.answer_cache` when this folder's config and tokenizer files were probed before with
    this transformers release: then neither torch nor transformers is imported.  The answer
    carries ``"cached": True`` when it came from the cache."""
    from . import answer_cache as C
    from ..formats.safe_input import read_json
    try:
        model_type = read_json(Path(folder) / "config.json", what="config.json").get("model_type")
    except (CkptError, OSError, AttributeError):
        model_type = None       # transformers' own reading says what is wrong
    key = C.answer_path("probe_folder", model_type, C.folder_inputs(folder))
    hit = C.load(key)
    if hit is not None:
        return dict(hit, cached=True)
    facts = probe_folder_isolated(folder, path) if isolate else probe_folder(folder)
    # as JSON gives it (the child's and the cache's way): every path hands the converter the same values
    facts = json.loads(json.dumps(facts))
    C.store(key, facts)
    return facts


class _CachedExpected:
    """:class:`ExpectedTensors`' interface, answered from :mod:`.answer_cache` when the config was
    checked before; the child process starts only on a miss, when :meth:`submit` gives the config
    (reading a GGUF's header before that takes milliseconds, so starting late costs little)."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._child: ExpectedTensors | _InProcess | None = None
        self._key = None
        self._shapes: dict | None = None
        self.cached = False

    def submit(self, config: dict) -> None:
        from . import answer_cache as C
        self._key = C.answer_path("expected_tensors", config.get("model_type"), C.config_inputs(config))
        hit = C.load(self._key)
        if hit is not None and isinstance(hit.get("shapes"), dict):
            self._shapes, self.cached = hit["shapes"], True
            return
        self._child = _InProcess(self.path) if _in_process() else ExpectedTensors(self.path)
        self._child.submit(config)

    def result(self) -> dict[str, tuple[int, ...]]:
        if self._shapes is None:
            if self._child is None:
                raise RuntimeError("submit(config) first")
            from . import answer_cache as C
            self._shapes = {k: list(v) for k, v in self._child.result().items()}
            C.store(self._key, {"shapes": self._shapes})
        return {k: tuple(v) for k, v in self._shapes.items()}

    def kill(self) -> None:
        if self._child is not None:
            self._child.kill()


def expected_tensors_in_subprocess(path: str | None = None):
    """The model's tensor shapes for a config that :meth:`submit` gives later.

    From :mod:`.answer_cache` when the config was checked before; else built in a child process
    (see module docstring), unless this process has imported torch and transformers already, in
    which case building the model here is cheaper than a new process; the answer is kept.
    """
    return _CachedExpected(path)


def check_tensors(expected: dict[str, tuple[int, ...]], got: dict[str, tuple[int, ...]], *,
                  path: str, what: str, source_names: dict | None = None) -> None:
    """Raise :class:`ConfigError` on the first (sorted) unmatched, missing or mis-shaped tensor.

    ``source_names`` maps a name in ``got`` back to the tensor name in the input file, so the
    message names what the user can find in their file.
    """
    src = source_names or {}
    extra = sorted(set(got) - set(expected))
    if extra:
        n = extra[0]
        raise ConfigError(f"{what} has no parameter {n!r} for this tensor ({len(extra)} unmatched in all: "
                          f"{', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''})",
                          path=path, tensor=src.get(n, n))
    missing = sorted(set(expected) - set(got))
    if missing:
        raise ConfigError(f"{what} needs {len(missing)} tensor(s) the file does not have: "
                          f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}",
                          path=path, tensor=missing[0], hint="it would be initialised at random, so nothing was written")
    for n in sorted(got):
        if tuple(got[n]) != tuple(expected[n]):
            raise ConfigError(f"shape {list(got[n])} but {what} expects {list(expected[n])}",
                              path=path, tensor=src.get(n, n), expected=list(expected[n]), got=list(got[n]))


# Optional packages that ``import transformers.modeling_utils`` loads although no model built
# here uses them: scipy (~0.4 s of the child's ~3.5 s, measured with ``python -X importtime``)
# comes only through the object-detection losses (transformers/loss/loss_for_object_detection.py,
# behind ``if is_scipy_available():``).  They are hidden while transformers is imported and put
# back before the model is built, so a model class that does import them still gets the real ones.
_HIDDEN_WHILE_IMPORTING = ("scipy",)
_PLAIN_ENV = "CKPT_SURGEON_MODEL_CHECK_PLAIN_IMPORT"


def _import_transformers() -> None:
    """Import torch and transformers' model machinery, hiding :data:`_HIDDEN_WHILE_IMPORTING`.

    A transformers release that cannot be imported without one of them (an ``ImportError``
    here) gets a fresh interpreter importing it plainly: this process re-executes itself with
    :data:`_PLAIN_ENV` set; stdin (the config) has not been read yet, so nothing is lost.
    """
    hide = os.environ.get(_PLAIN_ENV) != "1"
    hidden = [m for m in _HIDDEN_WHILE_IMPORTING if m not in sys.modules] if hide else []
    for m in hidden:
        sys.modules[m] = None      # ``import m`` raises ImportError, ``find_spec(m)`` is None
    try:
        import torch  # noqa: F401
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401
        import transformers.modeling_utils  # noqa: F401
    except ImportError:
        if not hidden:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name if __spec__ else
                                   "ckpt_surgeon.conversion.model_check"], dict(os.environ, **{_PLAIN_ENV: "1"}))
    finally:
        for m in hidden:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]
    if hidden:
        # transformers caches "not installed" answers; forget them for the packages hidden above.
        from transformers.utils import import_utils
        for m in hidden:
            fn = getattr(import_utils, f"is_{m}_available", None)
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()


def main() -> int:
    """Child-process entry point: config JSON on stdin -> ``{"shapes": {name: shape}}`` on stdout;
    with ``--probe FOLDER``: ``{"probe": probe_folder(FOLDER)}``.  The probe imports the model
    classes only after the tokenizer is built and gone (its peak memory is then the larger of
    the two, not their sum); nothing is waiting for it meanwhile."""
    if sys.argv[1:2] == ["--probe"]:
        try:
            print(json.dumps({"probe": probe_folder(sys.argv[2])}))
            return 0
        except Exception as e:  # noqa: BLE001 - reported to the parent as one line
            print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}))
            return 3
    try:
        # Import first, then wait for the config: the parent is reading its source meanwhile.
        _import_transformers()
        shapes = expected_tensors(json.loads(sys.stdin.read()))
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}))
        return 3
    print(json.dumps({"shapes": {k: list(v) for k, v in shapes.items()}}))
    return 0


if __name__ == "__main__":
    # No cyclic garbage collection in this short-lived child: importing torch + transformers
    # allocates hundreds of thousands of objects, and the collector's passes over them were
    # ~0.7 s of its ~3.4 s CPU (measured: 3.35-3.71 s with, 2.62-3.00 s without, 4 runs each);
    # the few cycles left behind cost ~10 MB, freed at exit.
    import gc
    gc.disable()
    code = main()
    # The answer is out; skip the interpreter's teardown (torch and transformers take ~0.9 s to
    # unwind their modules and atexit hooks), which the parent would otherwise wait for: it
    # reads until EOF and the exit status.  Nothing is left to flush but the streams themselves.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
