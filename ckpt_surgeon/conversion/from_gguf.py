"""GGUF -> HF folder that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load offline.

Steps (each a small function below):

1. ``config.json`` from the ``{arch}.*`` metadata through the arch row of :mod:`.names`
   (rope theta is always written: llama.cpp assumes 10000 when the key is absent, and an HF
   config without it would get the *family's* default, e.g. 1e6 for some);
   ``tie_word_embeddings`` when there is no ``output.weight`` or when it is byte-identical to
   ``token_embd.weight`` (llama.cpp's GPT-2 converter duplicates the tied matrix).
2. Every GGUF tensor mapped to its HF name; the set of names and shapes checked against the
   model transformers builds from that config on the meta device: an unmatched or a missing
   tensor is an error, never a randomly initialised weight.
3. Weights dequantized through our own reader (:mod:`ckpt_surgeon.formats.quant.dequant`), llama-arch
   Q/K rows un-permuted (weights and biases, :func:`~ckpt_surgeon.arch.layouts.llama_unpermute_index`),
   GPT-2 Conv1D weights transposed back to ``[in, out]``, Gemma norms shifted back by -1; then
   cast once to the requested dtype and streamed by the shared atomic writer
   (:class:`~ckpt_surgeon.formats.write.writer.CheckpointWriter`).  Tensors that need no change and
   already have the output dtype are copied as raw bytes.
4. ``tokenizer.json`` / ``tokenizer_config.json`` / ``generation_config.json`` rebuilt from
   ``tokenizer.ggml.*`` (:mod:`.tokenizer`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..arch.checked import TOKEN_ID, gguf_hparam, gguf_value
from ..arch.gguf_config import LONGROPE_TENSORS      # llama.cpp's longrope factor tensors (Phi-3)
from ..errors import FormatError, UnsupportedError
from ..progress import phase
from . import names as N
from .report import ConvertReport, TensorRecord
from .transforms import inverse, lookup

if TYPE_CHECKING:     # numpy is imported where used, after the model-check child has started
    import numpy as np

DEFAULT_SHARD_BYTES = 5 * 2**30    # like save_pretrained's "5GB" shards
ROPE_FREQS = "rope_freqs.weight"    # llama.cpp's per-dimension rope factors (llama3 scaling)
_LLAMACPP_DEFAULT_THETA = 10000.0  # llama.cpp llama-model.cpp: rope_freq_base_train default

# GGUF tensor type -> safetensors dtype whose bytes are identical (raw copy possible).
_RAW_SAME = {"F32": "F32", "F16": "F16", "BF16": "BF16"}


def hparams_from_gguf(meta: dict, arch: str, path: str | None = None) -> dict:
    """Canonical hyper-parameters present in the GGUF metadata (what the tensor transforms need),
    each type- and range-checked where read (:data:`ckpt_surgeon.arch.checked.GGUF_BOUNDS`)."""
    hp = {}
    for key, suffix in N.GGUF_HPARAM_KEYS.items():
        v = gguf_hparam(meta, arch, suffix, path=path, per_layer=True)
        if isinstance(v, list):   # per-layer arrays (head_count on some archs): all equal or refuse
            if len(set(v)) != 1:
                raise UnsupportedError(f"{arch}.{suffix} varies per layer ({v[:6]} ...): not converted", path=path)
            v = v[0]
        if v is not None:
            hp[key] = v
    hp.setdefault("n_head_kv", hp.get("n_head"))
    return hp


def _required_inputs(meta: dict, arch: str, tensors: dict, path: str | None):
    """The metadata keys every config needs, checked; returns the token embedding's tensor info."""
    for suffix in ("block_count", "embedding_length", "attention.head_count", "feed_forward_length",
                   "context_length"):
        if meta.get(f"{arch}.{suffix}") is None:
            raise FormatError(f"metadata key {arch}.{suffix} is missing", path=path)
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise FormatError("no token_embd.weight tensor", path=path)
    return emb


def _set_rope(cfg: dict, spec: N.ArchSpec, hp: dict, arch: str, warnings: list[str],
              scaling: dict | None = None) -> None:
    """RoPE keys of ``cfg`` (llama.cpp's default theta when the file has none; ``scaling``: rope
    parameters recovered from the file, llama3's); removed for non-RoPE families."""
    if spec.rope:
        rp = dict(cfg.get("rope_parameters") or {"rope_type": "default"})
        rp.update(scaling or {})
        theta = hp.get("rope_theta")
        if theta is None:
            warnings.append(f"{arch}.rope.freq_base is absent; llama.cpp runs this file with "
                            f"{_LLAMACPP_DEFAULT_THETA:g}, so that is written to config.json")
            theta = _LLAMACPP_DEFAULT_THETA
        rp["rope_theta"] = theta
        if rp.get("partial_rotary_factor") == 1.0 or spec.hf_rename.get("partial_rotary_factor", "") is None:
            del rp["partial_rotary_factor"]
            cfg.pop("partial_rotary_factor", None)
        # transformers >= 5 reads rope_parameters; transformers 4 and other tools read rope_theta.
        cfg["rope_parameters"] = rp
        cfg["rope_theta"] = theta
    else:
        for key in ("rope_parameters", "rope_theta", "partial_rotary_factor"):
            cfg.pop(key, None)


def _longrope_tensors(ck, spec: N.ArchSpec, src: Path):
    """(long, short) factors of a longrope file whose family converts it, else None."""
    present = [n for n in LONGROPE_TENSORS if n in ck.tensors]
    if not present or "longrope" not in spec.rope_scalings:
        return None
    if len(present) == 1:
        missing = next(n for n in LONGROPE_TENSORS if n not in present)
        raise FormatError(f"absent beside {present[0]}: llama.cpp needs both longrope factor tensors",
                          path=str(src), tensor=missing)
    return tuple(ck.read(n) for n in LONGROPE_TENSORS)


def _set_special_ids(cfg: dict, meta: dict, path: str | None) -> None:
    """bos/eos/pad/unk token ids from the tokenizer metadata (null when absent or past the vocabulary)."""
    from .tokenizer import SPECIAL_KEYS
    for typ in ("bos", "eos", "pad", "unk"):
        # Written even when absent (null): family config classes have defaults (Phi-3's
        # pad_token_id 32000) that would point outside a smaller vocabulary.
        v = gguf_value(meta, f"tokenizer.ggml.{SPECIAL_KEYS[typ]}", TOKEN_ID, path=path)
        cfg[f"{typ}_token_id"] = v if v is not None and v < cfg["vocab_size"] else None


def hf_config_from_gguf(meta: dict, spec: N.ArchSpec, tensors: dict, *, dtype: str, tied: bool,
                        path: str | None = None, rope_freqs=None, longrope=None) -> tuple[dict, list[str]]:
    """``config.json`` contents for a GGUF (metadata + tensor table), and warnings.

    The generic GGUF -> HF key map is :func:`ckpt_surgeon.arch.gguf_config.config_from_gguf`
    (shared with ``inspect``); the arch row adjusts it to the family's own config class
    (GPT-2 spellings, Phi-3's original context length, fixed activation names), and this
    function settles what the metadata alone cannot: the vocabulary size (the embedding's
    rows), tying (decided from the tensors), the bias switch and the dtype.
    """
    from ..arch.gguf_config import config_from_gguf

    arch = spec.gguf_arch
    warnings: list[str] = [spec.llamacpp_differs] if spec.llamacpp_differs else []
    emb = _required_inputs(meta, arch, tensors, path)
    base = config_from_gguf(meta, tensors, path=path)
    hp = hparams_from_gguf(meta, arch, path)
    if "value_length" not in spec.hparam_sums and hp.get("value_length") not in (None, base.get("head_dim")):
        raise UnsupportedError(f"key_length {base.get('head_dim')} != value_length {hp['value_length']}: "
                               "not representable in this HF config", path=path)
    cfg = _family_config(base, spec, meta, hp, tensors, path)
    _solve_sums(cfg, spec, hp, path)
    cfg["vocab_size"] = int(emb.shape[0])   # the embedding is the truth; metadata may omit or pad it
    scaling = _rope_scaling(meta, spec, hp, base, cfg, path, rope_freqs, longrope)
    _set_rope(cfg, spec, hp, arch, warnings, scaling)
    hp = dict(hp, head_dim=base.get("head_dim"))
    N.fixed_to_hf(spec, cfg, hp)
    if spec.bias_switch:
        cfg[spec.bias_switch] = spec.bias_probe in tensors
    cfg["tie_word_embeddings"] = bool(tied)
    _set_special_ids(cfg, meta, path)
    cfg["dtype"] = dtype
    cfg["torch_dtype"] = dtype    # transformers 4 spelling
    return dict(sorted(cfg.items())), warnings


def _family_config(base: dict, spec: N.ArchSpec, meta: dict, hp: dict, tensors: dict, path: str | None) -> dict:
    """The generic config ``base`` in the family's own spellings (``hf_rename``), with its fixed
    entries, the values llama.cpp needs, the converter's cases and ``None`` spellings, and the
    extra keys the family reads from the metadata (``hf_from_gguf``)."""
    arch = spec.gguf_arch
    cfg: dict = {"architectures": [spec.hf_architecture], "model_type": spec.hf_model_types[0]}
    for key, value in base.items():
        if key in ("architectures", "model_type", "rope_scaling") or value is None:
            continue
        if key in spec.hf_rename:
            key = spec.hf_rename[key]
            if key is None:
                continue
        cfg[key] = value
    cfg.update(spec.hf_config_extra)
    for key, value, why, *_ in spec.llamacpp_needs:
        if cfg.get(key, value) != value:      # a needed value the metadata also states (Phi-MoE's expert count)
            raise UnsupportedError(f"{key} = {cfg[key]!r} in this file is not converted ({why}); only {key} = "
                                   f"{value!r} is", path=path)
        cfg[key] = value
    cfg.update(N.hf_config_case(spec, hp, tensors))
    for key, unset in spec.hparam_unset.items():      # the converter's "None" spelling
        hf_key = N.HF_HPARAM_KEYS[key][0]
        if cfg.get(hf_key, unset) == unset:
            cfg[hf_key] = None
    for suffix, key in spec.hf_from_gguf.items():
        v = gguf_hparam(meta, arch, suffix, path=path)
        # (HF key, value when the file lacks it), or an HF key defaulting to the context length
        key, default = key if isinstance(key, tuple) else (key, cfg.get("max_position_embeddings"))
        cfg[key] = v if v is not None else default
    return cfg


def _rope_scaling(meta: dict, spec: N.ArchSpec, hp: dict, base: dict, cfg: dict, path: str | None,
                  rope_freqs, longrope) -> dict | None:
    """transformers' rope scaling parameters from llama.cpp's (llama3 factors, longrope factors,
    yarn keys), or None; a scaling this converter does not map is refused by name."""
    from ..arch.gguf_config import ROPE_SCALING_TYPES

    arch = spec.gguf_arch
    scaling = None
    if rope_freqs is not None:      # llama.cpp's llama3 rope factors -> transformers' rope parameters
        from .rope_llama3 import llama3_params_from_factors
        dim = hp.get("rotary_dim") or base.get("head_dim")
        scaling = llama3_params_from_factors(rope_freqs, hp.get("rope_theta", _LLAMACPP_DEFAULT_THETA), int(dim),
                                             path=path)
    stype = gguf_hparam(meta, arch, "rope.scaling.type", path=path)
    if stype not in (None, "none") and ROPE_SCALING_TYPES.get(stype, stype) not in spec.rope_scalings:
        only = " or ".join(repr(t) for t in ("none",) + tuple(t for t in spec.rope_scalings if t != "llama3"))
        raise UnsupportedError(f"{arch}.rope.scaling.type = {stype!r} is not converted for this architecture "
                               f"(only {only})", path=path)
    attn_factor = gguf_hparam(meta, arch, "rope.scaling.attn_factor", path=path)
    if longrope is not None:        # llama.cpp's longrope factors -> transformers' rope parameters
        from .rope_longrope import longrope_from_gguf
        scaling = longrope_from_gguf(*longrope, attn_factor, hp.get("orig_ctx"), cfg["max_position_embeddings"],
                                     rotary_dim=int(hp.get("rotary_dim") or base.get("head_dim")),
                                     mscales=spec.longrope_mscales, path=path)
    elif (base.get("rope_parameters") or {}).get("rope_type") == "yarn":
        from ..arch.gguf_config import YARN_KEYS
        from .rope_yarn_mscale import LOG_MUL, check_yarn_as_llamacpp_runs, yarn_mscale_from_gguf
        rp = base["rope_parameters"]
        if spec.yarn_log_mul and rp.get("attention_factor") is not None:
            raise UnsupportedError(f"{arch}.rope.scaling.yarn_attn_factor is not converted (llama.cpp's {arch} "
                                   "ignores it, transformers would apply it)", path=path)
        check_yarn_as_llamacpp_runs({k: rp.get(k) for _, k in YARN_KEYS}, float(rp.get("factor") or 1.0), arch,
                                    spelled={k: f"{arch}.{suffix}" for suffix, k in YARN_KEYS}, path=path)
        if spec.yarn_log_mul:
            scaling = yarn_mscale_from_gguf(gguf_hparam(meta, arch, LOG_MUL, path=path), arch, path)
    if longrope is None and attn_factor not in (None, 1.0):
        raise UnsupportedError(f"{arch}.rope.scaling.attn_factor = {attn_factor:g} is not converted (llama.cpp "
                               "multiplies cos and sin by it; only longrope files carry it here)", path=path)
    return scaling


def _solve_sums(cfg: dict, spec: N.ArchSpec, hp: dict, path: str | None) -> None:
    """HF config keys from hyper-parameters that are their sums (``hparam_sums``), one unknown at a time."""
    sums = {k: parts for k, parts in spec.hparam_sums.items() if k in hp}
    known = {}
    while sums:
        solvable = [(k, parts) for k, parts in sums.items() if sum(p not in known for p in parts) <= 1]
        if not solvable:
            raise FormatError(f"{arch_keys(spec, sums)} do not determine {', '.join(p for ps in sums.values() for p in ps)}",
                              path=path)
        k, parts = solvable[0]
        unknown = [p for p in parts if p not in known]
        value = int(hp[k]) - sum(known[p] for p in parts if p in known)
        if value < 0 or (not unknown and value != 0):
            raise FormatError(f"{spec.gguf_arch}.{N.GGUF_HPARAM_KEYS[k]} = {hp[k]} is not the sum of "
                              f"{' + '.join(parts)} given by the other keys", path=path)
        if unknown:
            known[unknown[0]] = value
        del sums[k]
    cfg.update(known)


def arch_keys(spec: N.ArchSpec, sums: dict) -> str:
    return ", ".join(f"{spec.gguf_arch}.{N.GGUF_HPARAM_KEYS[k]}" for k in sums)


def _looks_gguf(p: Path) -> bool:
    """By magic, regular files only (a FIFO named x.gguf must not block here); the real open
    reports whatever is wrong."""
    from ..errors import CkptError
    from ..formats.magic import file_kind
    try:
        return file_kind(p) == "gguf"
    except (CkptError, OSError):
        return False


def _same_bytes(ck, a: str, b: str) -> bool:
    ia, ib = ck.tensors[a], ck.tensors[b]
    if ia.dtype != ib.dtype or tuple(ia.shape) != tuple(ib.shape) or ia.nbytes != ib.nbytes:
        return False
    return ck.read_raw(a) == ck.read_raw(b)


def _source_arch(ck, src: Path) -> tuple[dict, str, N.ArchSpec]:
    """The GGUF's metadata, architecture and arch row, after the checks that need no tensor data."""
    if ck.naming != "gguf":
        raise UnsupportedError("is not a GGUF file; to convert an HF model to GGUF give an output path "
                               "ending in .gguf", path=str(src))
    meta = ck.metadata
    arch = ck.gguf_arch or meta.get("general.architecture")
    spec = N.by_gguf_arch(arch, meta)
    if spec is None:
        raise UnsupportedError(f"GGUF architecture {arch!r} has no HF mapping here "
                               f"(supported: {', '.join(a.gguf_arch for a in N.ARCHS)})", path=str(src))
    ck.refuse_truncated()          # the same line as every command but inspect
    # config values and layer count checked before any work; every shape is compared with the
    # transformers model below, with that check's own message
    ck.layout(shapes=False)
    return meta, arch, spec


def _tensor_plan(ck, spec: N.ArchSpec, arch: str, tied: bool, src: Path, config: dict) -> list[tuple]:
    """(gguf name, HF name, transform, HF shape, GGUF dtype, expert slot or None) per output tensor,
    HF names as the model ``config`` describes spells them."""
    names = N.gguf_to_hf_names(spec, config)
    plan = []
    for gname, info in ck.tensors.items():
        if tied and gname == "output.weight":
            continue       # byte-identical duplicate of token_embd (tied): the HF model shares it
        if gname == ROPE_FREQS and "llama3" in spec.rope_scalings:
            continue       # llama3 rope factors: in config.json's rope_parameters (hf_config_from_gguf)
        if gname in LONGROPE_TENSORS and "longrope" in spec.rope_scalings:
            continue       # longrope factors: in config.json's rope_parameters too
        hit = names.match(gname)
        if hit is None:
            raise UnsupportedError(f"no HF name for this tensor in the {arch} mapping (the converted model "
                                   "would silently lack it)", path=str(src), tensor=gname)
        hname, rule = hit
        if rule.split:        # the parts of a Split row -> one HF tensor, made when its first part is met
            joined = _split_plan(ck, names, rule, gname, hname, src)
            if joined is not None:
                plan.append(joined)
            continue
        shape = lookup(rule.transform).hf_shape(info.shape)
        if rule.experts:      # one GGUF tensor [n_expert, ...] -> one HF tensor per expert
            if len(shape) < 2:
                raise FormatError(f"expert tensor has shape {list(shape)}; expected [experts, ...]",
                                  path=str(src), tensor=gname)
            stack = _ExpertStack(ck, gname, rule.transform, shape[0])
            plan.extend((gname, hname.replace("{E}", str(e)), rule.transform, shape[1:], info.dtype, (stack, e))
                        for e in range(shape[0]))
        else:
            plan.append((gname, hname, rule.transform, shape, info.dtype, None))
    return plan


def _split_plan(ck, names, rule, gname: str, hname: str, src: Path) -> tuple | None:
    """The plan entry joining a Split row's GGUF parts into ``hname`` (None for the other parts)."""
    from .splits import joined_shape
    if names.part(gname) != 0:
        return None
    layer = N.template_regex(rule.gguf).match(gname).groupdict().get("L")
    pnames = [p.replace("{L}", layer) if layer is not None else p for p in rule.parts]
    absent = [p for p in pnames if p not in ck.tensors]
    if absent:
        raise FormatError(f"{absent[0]} is missing: it and {gname} together make {hname}", path=str(src), tensor=gname)
    try:
        shape = joined_shape(rule.split, [tuple(ck.tensors[p].shape) for p in pnames])
    except ValueError:
        raise FormatError(f"shapes {[list(ck.tensors[p].shape) for p in pnames]} of {', '.join(pnames)} do not "
                          f"join into one {hname}", path=str(src), tensor=gname) from None
    return (gname, hname, f"join:{rule.split}", shape, ck.tensors[gname].dtype, (_Join(ck, pnames, rule.split), None))


def _write_hf(w, ck, plan: list[tuple], gate, hp: dict, dtype: str, spec: N.ArchSpec) -> list[TensorRecord]:
    """Queue every planned tensor on the open writer ``w`` (raw copies where the bytes are the same),
    in ``dtype``, or F32 for the tensors transformers keeps float32 (``spec.hf_float32``)."""
    records = []
    keep32 = [N.template_regex(t) for t in spec.hf_float32]
    for gname, hname, transform, shape, gdtype, expert in plan:
        st_dtype = "F32" if any(rx.match(hname) for rx in keep32) else dtype
        if expert is not None:
            w.put(hname, gate.wrap(expert[0].producer(expert[1], hp, st_dtype)), dtype=st_dtype,
                  shape=shape)
        elif transform == "none" and _RAW_SAME.get(gdtype) == st_dtype:
            w.copy(gname, as_name=hname)
        else:
            w.put(hname, gate.wrap(_producer(ck, gname, transform, hp, st_dtype)), dtype=st_dtype,
                  shape=shape)
        records.append(TensorRecord(gname, hname, transform, gdtype, st_dtype, shape))
    return records


def _open_source(src: Path, dtype: str, child):
    """(normalized dtype, safetensors dtype, open checkpoint); the model-check ``child`` is killed on failure."""
    try:
        from ..checkpoint import open_checkpoint

        from .dtypes import normalize_dtype

        dtype = normalize_dtype(dtype, to_gguf=False)
        st_dtype = N.HF_DTYPES[dtype]
        ck = open_checkpoint(src)
    except BaseException:
        if child is not None:
            child.kill()
        raise
    return dtype, st_dtype, ck


def _tokenizer_files(meta: dict, config: dict, tokenizer: bool, src: Path, warnings: list[str]):
    """(GGUF vocabulary, rebuilt HF tokenizer files), both None when the file has none or ``tokenizer`` is off."""
    from .tokenizer import hf_tokenizer_files, vocab_from_metadata

    tok_files = None
    vocab = vocab_from_metadata(meta, str(src)) if tokenizer else None
    if vocab is not None:
        tok_files = hf_tokenizer_files(vocab, model_max_length=config.get("max_position_embeddings")
                                       or config.get("n_positions"), path=str(src),
                                       model_name=meta.get("general.name") if isinstance(meta.get("general.name"), str)
                                       else None,
                                       arch=meta.get("general.architecture")
                                       if isinstance(meta.get("general.architecture"), str) else None)
        warnings.extend(tok_files.warnings)
    return vocab, tok_files


def _add_tokenizer_files(w, tok_files) -> None:
    """tokenizer.json, tokenizer_config.json and (when it names special ids) generation_config.json."""
    w.add_file("tokenizer.json", tok_files.tokenizer_json)
    w.add_file("tokenizer_config.json", _json(tok_files.tokenizer_config))
    if tok_files.special_ids:
        w.add_file("generation_config.json", _json(dict(tok_files.special_ids)))
    for rel, text in tok_files.extra_files.items():
        w.add_file(rel, text)


def gguf_to_hf_report(gguf_path, out_dir, dtype: str = "float32", force: bool = False, *,
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES, tokenizer: bool = True,
                      progress: bool | None = False) -> ConvertReport:
    """Convert and return the :class:`ConvertReport` (see :func:`gguf_to_hf`).  ``progress``: a
    bar over the bytes written on stderr (None: only when stderr is a terminal)."""
    from .model_check import check_tensors, expected_tensors_in_subprocess

    t0 = time.perf_counter()
    src = Path(gguf_path)
    out = Path(out_dir)
    if out.name.endswith((".gguf", ".safetensors")):
        also = " (or, to quantize the GGUF, give --dtype q4_k_m ...)" if out.name.endswith(".gguf") else ""
        raise UnsupportedError("the source is a GGUF file, so the output is an HF folder (config, tokenizer, "
                               f"safetensors): give a folder path, not a file name{also}", path=str(out))
    # The model check needs torch + transformers (seconds of imports) and is the critical path: a
    # child process starts on them first thing, before even this function's own imports, gets
    # the config once it is known, and gates the output (see _Gate).
    child = expected_tensors_in_subprocess(str(src)) if _looks_gguf(src) else None
    dtype, st_dtype, ck = _open_source(src, dtype, child)
    try:
        from ..formats.write.writer import CheckpointWriter

        meta, arch, spec = _source_arch(ck, src)
        tied = "output.weight" not in ck.tensors or _same_bytes(ck, "output.weight", "token_embd.weight")
        rope_freqs = ck.read(ROPE_FREQS) if ROPE_FREQS in ck.tensors and "llama3" in spec.rope_scalings else None
        config, warnings = hf_config_from_gguf(meta, spec, ck.tensors, dtype=dtype, tied=tied, path=str(src),
                                               rope_freqs=rope_freqs, longrope=_longrope_tensors(ck, spec, src))
        hp = hparams_from_gguf(meta, arch, str(src))
        plan = _tensor_plan(ck, spec, arch, tied, src, config)

        # The model check runs in a child while the tensors are written; the writer waits for it
        # just before publishing (all shards written, fsync'd and verified by then), so a failed
        # check leaves nothing at OUT.  The writer checks the destination (exists? inside the
        # source?) when it is made, before any work starts.
        gate = _Gate(on_abandon=child.kill)
        w = CheckpointWriter(out, source=ck, force=force, copy_untouched=False, max_shard_bytes=max_shard_bytes,
                             before_publish=_announced(gate.wait, progress), progress=progress)
        child.submit(config)
        gate.start(lambda: check_tensors(
            child.result(), {h: s for _, h, _, s, _, _ in plan}, path=str(src),
            what=f"{spec.hf_architecture} built from this file's metadata",
            source_names={h: g for g, h, _, _, _, _ in plan}))
        vocab, records = _write_gated(w, gate, ck, plan, hp, st_dtype, spec, meta, config, tokenizer, src, warnings,
                                      {"from": "gguf", "source": src.name, "arch": arch, "dtype": dtype})
        result = w.result
    except BaseException:
        if child is not None:
            child.kill()
        raise
    finally:
        ck.close()
    return ConvertReport("gguf->hf", str(src), str(out), arch, config["model_type"], dtype, len(records),
                         result.bytes_written, time.perf_counter() - t0, tied,
                         vocab.model if vocab is not None else None, tuple(records), tuple(warnings), config)


def _announced(wait, progress):
    """The gate's wait as a named phase: the tensor-set check (transformers in a child) may outlast the writing."""
    def run():
        with phase(progress, "checking the tensor set against the model transformers builds"):
            wait()
    return run


def _write_gated(w, gate, ck, plan, hp, st_dtype, spec, meta, config, tokenizer, src, warnings, record):
    """Write the HF folder (tensors, config, tokenizer files) -> (vocab, tensor records); any
    failure abandons the model check first."""
    try:
        vocab, tok_files = _tokenizer_files(meta, config, tokenizer, src, warnings)
        with w:
            records = _write_hf(w, ck, plan, gate, hp, st_dtype, spec)
            w.set_config(config)
            if tok_files is not None:
                _add_tokenizer_files(w, tok_files)
            w.record("convert", record)
    except BaseException:
        gate.abandon()
        raise
    return vocab, records


class _Gate:
    """Run a check in a background thread; the output may be published only once it passed.

    The writer calls :meth:`wait` just before publishing (its ``before_publish`` hook); a
    producer that runs after the check failed re-raises its error at once, so streaming stops
    early.  The check costs no wall time when it is faster than writing and verifying the output.
    """

    def __init__(self, on_abandon=None):
        self._on_abandon = on_abandon
        self._error: BaseException | None = None
        self._thread = None

    def start(self, fn) -> None:
        import threading

        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                self._error = e

        self._thread = threading.Thread(target=run, name="ckpt-model-check", daemon=True)
        self._thread.start()

    def abandon(self) -> None:
        """The conversion failed elsewhere: stop the check's work (the thread ends with it)."""
        if self._on_abandon is not None:
            self._on_abandon()

    def wait(self) -> None:
        if self._thread is None:
            raise RuntimeError("the model check was never started")
        self._thread.join()
        if self._error is not None:
            raise self._error

    def wrap(self, make):
        def produce():
            if self._error is not None:     # the check already failed: stop streaming now
                raise self._error
            return make()
        return produce


def _producer(ck, gname: str, transform: str, hp: dict, st_dtype: str):
    """Lazy value for the writer: read (dequantize), transform, encode; called once, when written."""
    def make():
        return _encode_hf(inverse(ck.read(gname), transform, hp), st_dtype)
    return make


class _Join:
    """The GGUF parts of one Split row, dequantized and joined into their HF tensor (.splits)."""

    def __init__(self, ck, gnames: list[str], kind: str):
        self._ck, self._gnames, self._kind = ck, gnames, kind

    def producer(self, _slot, hp: dict, st_dtype: str):
        def make():
            from .splits import join
            parts = [self._ck.read(g) for g in self._gnames]
            if len({p.dtype for p in parts}) > 1:
                parts = [p.astype("float32") for p in parts]
            return _encode_hf(join(self._kind, parts), st_dtype)
        return make


class _ExpertStack:
    """One stacked GGUF expert tensor read (dequantized) once for its ``n`` per-expert HF tensors,
    and dropped when the last of them has been produced (memory: one GGUF tensor, as for any other)."""

    def __init__(self, ck, gname: str, transform: str, n: int):
        self._ck, self._gname, self._transform, self._left = ck, gname, transform, n
        self._arr = None

    def producer(self, e: int, hp: dict, st_dtype: str):
        def make():
            if self._arr is None:
                self._arr = self._ck.read(self._gname)
            part = _encode_hf(inverse(self._arr[e], self._transform, hp), st_dtype)
            self._left -= 1
            if self._left == 0:
                self._arr = None
            return part
        return make


def _encode_hf(arr: np.ndarray, st_dtype: str) -> bytes:
    """Little-endian bytes of ``arr`` in the safetensors dtype, rounded once to nearest-even.

    float32 input (every dequantized tensor) goes straight to the target with numpy / ml_dtypes
    (one rounding, two copies of the tensor at most: an embedding of a 7B model is GBs);
    float64 input (Gemma's shifted norms, small) goes through the shared writer's exact caster.
    """
    import numpy as np
    if arr.dtype == np.float64:
        from ..formats.write.writer import cast_to_dtype
        return cast_to_dtype(arr, st_dtype)
    arr = np.asarray(arr, dtype=np.float32)
    if st_dtype == "F32":
        return arr.tobytes()
    if st_dtype == "F16":
        return arr.astype("<f2").tobytes()
    if st_dtype == "BF16":
        import ml_dtypes
        return arr.astype(ml_dtypes.bfloat16).view("<u2").tobytes()
    raise UnsupportedError(f"HF output dtype {st_dtype} is not supported")


def _json(obj) -> str:
    import json
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def gguf_to_hf(gguf_path, out_dir, dtype: str = "float32", force: bool = False) -> Path:
    """Convert a GGUF file to an HF folder (config.json, safetensors, tokenizer files) transformers loads.

    ``dtype``: ``float32`` | ``float16`` | ``bfloat16`` for every tensor.  Returns ``Path(out_dir)``;
    :func:`ckpt_surgeon.convert` returns the full report instead.  Raises
    :class:`~ckpt_surgeon.errors.CkptError` subclasses on bad input; nothing is written then.

    Example::

        from ckpt_surgeon import gguf_to_hf
        out = gguf_to_hf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-hf", dtype="bfloat16")
    """
    return Path(gguf_to_hf_report(gguf_path, out_dir, dtype=dtype, force=force).output)


__all__ = ["gguf_to_hf", "gguf_to_hf_report", "hf_config_from_gguf"]


def hf_view(ck, src: Path) -> tuple[dict, dict, list, list[str]]:
    """An open GGUF seen as the HF checkpoint :func:`gguf_to_hf_report` would write, without
    writing it: ``(config, hparams, plan, warnings)``.  ``plan`` holds one entry per HF tensor
    (``(gguf name, HF name, transform, HF shape, GGUF dtype, expert / join or None)``);
    :func:`hf_array` produces an entry's tensor.  For callers that read one HF tensor at a time
    (``verify``'s layer streaming: a 70B GGUF is never expanded to a 280 GB float32 folder)."""
    meta, arch, spec = _source_arch(ck, src)
    tied = "output.weight" not in ck.tensors or _same_bytes(ck, "output.weight", "token_embd.weight")
    rope_freqs = ck.read(ROPE_FREQS) if ROPE_FREQS in ck.tensors and "llama3" in spec.rope_scalings else None
    config, warnings = hf_config_from_gguf(meta, spec, ck.tensors, dtype="float32", tied=tied, path=str(src),
                                           rope_freqs=rope_freqs, longrope=_longrope_tensors(ck, spec, src))
    hp = hparams_from_gguf(meta, arch, str(src))
    return config, hp, _tensor_plan(ck, spec, arch, tied, src, config), warnings


def hf_array(ck, entry: tuple, hp: dict, cache: dict | None = None) -> np.ndarray:
    """The HF tensor of one :func:`hf_view` plan entry, dequantized and transformed exactly as the
    converter writes it (before the cast to the output dtype).  ``cache``: a dict that keeps a
    stacked expert tensor between the calls for its experts (the caller clears it)."""
    from .splits import join
    gname, _hname, transform, _shape, _gdtype, extra = entry
    if extra is None:
        return inverse(ck.read(gname), transform, hp)
    obj, slot = extra
    if isinstance(obj, _Join):
        parts = [ck.read(g) for g in obj._gnames]
        if len({p.dtype for p in parts}) > 1:
            parts = [p.astype("float32") for p in parts]
        return join(obj._kind, parts)
    cache = {} if cache is None else cache
    if gname not in cache:
        cache[gname] = ck.read(gname)
    return inverse(cache[gname][slot], transform, hp)


def write_hf_tokenizer(ck, config: dict, out: Path) -> bool:
    """The HF tokenizer files :func:`gguf_to_hf_report` writes beside the weights, written into
    ``out`` alone (tokenizer.json, tokenizer_config.json, generation_config.json when it names
    special ids).  False when the GGUF holds no tokenizer."""
    warnings: list[str] = []
    _vocab, tok_files = _tokenizer_files(ck.metadata, config, True, Path(ck.source), warnings)
    if tok_files is None:
        return False
    data = tok_files.tokenizer_json
    (out / "tokenizer.json").write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    (out / "tokenizer_config.json").write_text(_json(tok_files.tokenizer_config), encoding="utf-8")
    if tok_files.special_ids:
        (out / "generation_config.json").write_text(_json(dict(tok_files.special_ids)), encoding="utf-8")
    for rel, text in tok_files.extra_files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text, encoding="utf-8")
    return True
