"""Inputs for one forward pass of a transformers model, or of one of its towers alone, built from its config.

No processor runs here (no image, audio or tokenizer files): every input is seeded noise of the shape the
modeling file reads from its own config, as transformers' model testers build them
(``prepare_config_and_inputs``: ``floats_tensor([batch, num_channels, image_size, image_size])`` for a vision
model, ``[batch, num_mel_bins, 2 * max_source_positions]`` for Whisper's encoder, ``[seq, channels x
temporal_patch x patch x patch]`` patches with ``grid_thw`` for Qwen2-VL's vision tower ...).

* :func:`model_inputs`: token ids (and decoder ids for an encoder-decoder); with ``model`` also the input a
  forward cannot run without when it is not token ids (its ``main_input_name``: BLIP's ``pixel_values``,
  Whisper's ``input_features``, a speech model's ``input_values``, Pix2Struct's ``flattened_patches``) and any
  other required argument (InstructBLIP's ``qformer_input_ids``).
* :func:`tower_input`: the module that runs a vision / audio tower alone (a token-id forward of a
  vision-language model never runs it) and its inputs.

Several shapes are plausible for one input name (a mel spectrogram is ``[b, mel, frames]`` for Whisper-style
encoders, ``[b, frames, features]`` for conformers); the candidates are tried in order and the first the
modeling file runs is taken.  Nothing is claimed from a run alone: the probe's control (perturbing ``W_k``
must move the outputs) is what says the block was seen.
"""
from __future__ import annotations

import inspect
import itertools
import re

SEQ_LEN = 12
MAX_TOWER_TOKENS = 1024          # image patches / audio frames of a tower run (float64 attention is quadratic)
_FRAMES = (64, 200)              # audio frames tried when the config does not fix them (conv strides divide them)

# config attribute names per quantity (transformers' configs spell them several ways)
_IMAGE = ("image_size", "img_size", "vision_image_size")
_PATCH = ("patch_size", "spatial_patch_size", "vision_patch_size")
_CHANNELS = ("num_channels", "in_channels", "in_chans", "num_input_channels", "image_channels")
_MEL = ("num_mel_bins", "n_mels", "input_feat_per_channel", "feature_size", "feature_projection_input_dim",
        "input_dim", "n_mel", "mel_bins", "num_mel_filters", "input_size", "in_channels")
_GRIDS = ("grid_thw", "image_grid_thw", "grid_hw", "image_grid_hw")
_SUBS = ("vision_config", "audio_config", "encoder_config", "speech_config", "encoder", "vision_encoder_config")


def token_inputs(conf, seed: int = 0) -> dict:
    """Random token ids (and decoder ids for encoder-decoders) for one forward pass."""
    import torch
    g = torch.Generator().manual_seed(seed + 2)
    vocab = int(getattr(conf, "vocab_size", 0) or 0) or 100
    hi = max(2, min(vocab, 1000))
    inputs = {"input_ids": torch.randint(1 if hi > 2 else 0, hi, (1, SEQ_LEN), generator=g)}
    if getattr(conf, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(1 if hi > 2 else 0, hi, (1, SEQ_LEN - 3), generator=g)
    return inputs


def model_inputs(conf, seed: int = 0, model=None) -> dict:
    """Inputs for one forward pass of ``model`` (token ids only when ``model`` is None or its forward needs
    nothing else); a non-token main input is the first candidate shape the model runs (:func:`first_run`)."""
    inputs = token_inputs(conf, seed)
    if model is None:
        return inputs
    params = _params(model)
    main = getattr(model, "main_input_name", "input_ids")
    main = main[0] if isinstance(main, (list, tuple)) else main
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if main == "input_ids" and all(n in inputs for n in required):
        return inputs
    text = {k: v for k, v in inputs.items() if k in params}
    if "input_ids" not in params and "decoder_input_ids" in params and "input_ids" in inputs:
        text["decoder_input_ids"] = inputs["input_ids"][:, : SEQ_LEN - 3]   # vision/speech encoder-decoders
    for n in required:
        if n.endswith("input_ids") and n not in text:
            text[n] = token_inputs(conf, seed + 1)["input_ids"][:, :SEQ_LEN - 4] % 100 + 1
    if main in ("input_ids", "inputs_embeds"):
        return text
    latent = _get(_configs(model), ("latent_query_num",))
    if "image_embeds_position_mask" in params and isinstance(latent, int) and "input_ids" in text:
        # Kosmos-2: the image's latent queries take the positions after the first token (Kosmos2ModelTester:
        # image_embeds_position_mask[:, 1:1 + latent_query_num] = 1, the text after them)
        import torch
        ids = text["input_ids"]
        text["input_ids"] = torch.cat([ids[:, :1], ids.new_ones((1, latent)), ids[:, 1:]], dim=1)
        mask = torch.zeros_like(text["input_ids"])
        mask[:, 1:1 + latent] = 1
        text["image_embeds_position_mask"] = mask
    queries = _get(_configs(model), ("num_query_tokens",))
    image_id = next((v for k in ("image_token_id", "image_token_index") if type(v := getattr(model.config, k, None)) is int),
                    None)
    texts = [text]
    if isinstance(queries, int) and image_id is not None and "input_ids" in text:
        # BLIP-2 / InstructBLIP: the Q-Former's query outputs replace that many image tokens at the start of the
        # text (Blip2ForConditionalGenerationDecoderOnlyModelTester: image_token_index x num_query_tokens + ids);
        # without them the pixels never reach the logits (tried first; the text alone if the model refuses them)
        import torch
        ids = text["input_ids"]
        texts.insert(0, dict(text, input_ids=torch.cat([ids.new_full((1, queries), image_id), ids], dim=1)))
    cands = [dict(t, **c) for t in texts for c in feeds(model, main, seed, whole=True)]
    found = first_run(model, cands)
    return found if found is not None else dict(text)


def _params(mod) -> dict:
    try:
        return dict(inspect.signature(mod.forward).parameters)
    except (TypeError, ValueError):
        return {}


def _configs(mod):
    """The module's config and its vision / audio / encoder sub-configs (a composite model's whole forward
    reads its pixels' sizes from ``vision_config``)."""
    c = getattr(mod, "config", None)
    if c is None:
        return []
    out = [c]
    for name in _SUBS:
        sub = getattr(c, name, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool, dict)):
            out.append(sub)
    return out


def _get(confs, names, kind=int):
    for c in confs:
        for n in names:
            v = getattr(c, n, None)
            if isinstance(v, kind) and not isinstance(v, bool) and v:
                return v
            if kind is int and isinstance(v, (list, tuple)) and v and all(type(x) is int for x in v):
                return tuple(v)
    return None


def _square(v):
    if isinstance(v, tuple):
        return v[0], v[-1] if len(v) > 1 else v[0]
    return v, v


_IMAGE_INPUTS = ("pixel_values", "hidden_states", "flattened_patches", "patch_embeds")
_WAVE_INPUTS = ("input_values", "inputs", "audio_values")


def feeds(mod, name: str, seed: int = 0, *, whole: bool = False) -> list[dict]:
    """Candidate values for the input ``name`` of ``mod`` (``{name: tensor, companions...}``), from its config.
    ``whole``: ``mod`` is a complete model (sizes may sit in its sub-configs).  One helper per input kind
    (image, audio features, waveform, Q-Former query / token ids, state), all drawing from one seeded stream."""
    import torch
    confs = _configs(mod)
    params = _params(mod)
    g = torch.Generator().manual_seed(seed + 3)

    def noise(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float64)
    grid_name = next((n for n in _GRIDS if n in params), None)
    if name == "hidden_states" and grid_name is None:
        return [{name: d.pop("input_features"), **d} for d in feeds(mod, "input_features", seed, whole=whole)]
    if name in _IMAGE_INPUTS:
        return _image_feeds(name, confs, params, noise, grid_name, whole)
    if name == "input_features":
        return _audio_feeds(name, confs, params, noise)
    if name in _WAVE_INPUTS:
        return [{name: noise(1, n)} for n in (16000, 4000)] + \
            [{name: noise(1, 1, n)} for n in (16000, 4000)]     # [b, 1, samples] (OmniASR's conv front end)
    if name in ("query_embeds", "input_ids"):
        return _query_feeds(mod, name, confs, noise, seed)
    if name == "state":
        dim = _get(confs, ("max_state_dim", "state_dim"))
        return [{name: noise(1, dim)}] if dim else []
    return []


def _image_feeds(name: str, confs, params: dict, noise, grid_name: str | None, whole: bool) -> list[dict]:
    """Pixels or patches: the processor's flattened patches with their grid (:func:`_grid_feeds`), Pix2Struct's
    flattened patches with row / column, SigLIP-2 NaFlex patches, or an image of the config's size
    (:func:`_sized_feeds`); nothing without a patch size."""
    import torch
    patch = _get(confs, _PATCH)
    ch = _get(confs, _CHANNELS) or 3
    ch = ch[0] if isinstance(ch, tuple) else ch
    if patch is None:
        return []
    ph, pw = _square(patch)
    if grid_name is not None:
        return _grid_feeds(name, confs, params, noise, grid_name, ch * ph * pw)
    if name == "flattened_patches":
        # Pix2Struct / Kosmos-2.5: [b, n, 2 + C*p*p], the first two values a patch's row and column
        width = _get(confs, ("patch_embed_hidden_size",)) or ch * ph * pw
        n = 16
        rc = torch.tensor([[i // 4 + 1, i % 4 + 1] for i in range(n)], dtype=torch.float64)[None]
        return [{name: torch.cat([rc, noise(1, n, width)], dim=-1)}]
    if "spatial_shapes" in params:
        # SigLIP-2 NaFlex (LFM2-VL): [b, n, C*p*p] patches, their mask and the (h, w) patch grid
        # (Siglip2VisionModelTester: pixel_values [b, n, C*p*p], spatial_shapes [[h, w]])
        side = 4
        return [{name: noise(1, side * side, ch * ph * pw),
                 "pixel_attention_mask": torch.ones((1, side * side), dtype=torch.long),
                 "spatial_shapes": torch.tensor([[side, side]], dtype=torch.long)}]
    size = _get(confs, _IMAGE)
    return [] if size is None else _sized_feeds(name, params, noise, _square(size), (ch, ph, pw), whole)


def _grid_feeds(name: str, confs, params: dict, noise, grid_name: str, patch_width: int) -> list[dict]:
    """Qwen2-VL style: the processor's flattened patches [t*h*w, C*tp*p*p] and their grid (h, w multiples of
    the merge size; modeling_qwen2_vl VisionTransformer.forward); ``patch_width`` is C*p*p."""
    import torch
    tp = _get(confs, ("temporal_patch_size",)) or 1
    merge = _get(confs, ("spatial_merge_size", "merge_size", "downsample_factor")) or 1
    merge = merge[0] if isinstance(merge, tuple) else merge
    side = 2 * merge
    grid = [1, side, side] if grid_name.endswith("thw") else [side, side]
    out = []
    for width in dict.fromkeys((patch_width * tp, patch_width)):
        out.append({name: noise(side * side, width), grid_name: torch.tensor([grid], dtype=torch.long)})
        if "merge_sizes" in params:     # VideoLLaMA-3: the merge size of each image
            out[-1]["merge_sizes"] = torch.tensor([merge], dtype=torch.long)
    return out


def _sized_feeds(name: str, params: dict, noise, size: tuple, chw: tuple, whole: bool) -> list[dict]:
    """An image [b, C, H, W] of the config's size (``size`` = (H, W); ``chw`` = (C, patch h, patch w)) when
    its patches fit a tower run, and a smaller one where the forward interpolates its position table."""
    import torch
    (hs, ws), (ch, ph, pw) = size, chw
    out = []
    if (hs // ph) * (ws // pw) <= MAX_TOWER_TOKENS:
        out.append({name: noise(1, ch, hs, ws)})
        if "target_sizes" in params:     # MiniCPM-V: the patch grid of each image
            out.append({name: noise(1, ch, hs, ws),
                        "target_sizes": torch.tensor([[hs // ph, ws // pw]], dtype=torch.int32)})
        if whole:
            out.append({name: noise(1, 1, ch, hs, ws)})   # [batch, images, C, H, W] (Idefics3)
    if "interpolate_pos_encoding" in params:
        # a smaller image, the position table interpolated (CLIP / SigLIP forward option)
        side = 8 * ph
        out.append({name: noise(1, ch, side, side), "interpolate_pos_encoding": True})
    return out


def _audio_feeds(name: str, confs, params: dict, noise) -> list[dict]:
    """A mel spectrogram, [b, mel, frames] and [b, frames, mel], over the frame counts the config fixes
    (Whisper: 2 x max_source_positions) or :data:`_FRAMES`, with a frame mask or frame counts where the
    forward takes them."""
    import torch
    mel = _get(confs, _MEL)
    mel = mel[0] if isinstance(mel, tuple) else mel
    fixed = _get(confs, ("max_source_positions",))
    frames = [2 * fixed] if isinstance(fixed, int) and 2 * fixed <= 4 * MAX_TOWER_TOKENS else []
    frames += [f for f in _FRAMES if f not in frames]
    lens = next((n for n in ("feature_lens", "audio_feature_lengths") if n in params), None)
    mask = next((n for n in ("input_features_mask", "feature_attention_mask") if n in params), None)
    out: list[dict] = []
    if not mel:
        return out
    for f in frames:
        for x in (noise(1, mel, f), noise(1, f, mel)):
            d = {name: x}
            if mask is not None:
                d[mask] = torch.ones((1, f), dtype=torch.long)
            out.append(d)
        if lens is not None:     # Qwen2.5-Omni's audio encoder: [mel, frames] with the frame counts
            out.append({name: noise(mel, f), lens: torch.tensor([f], dtype=torch.long)})
    return out


def _query_feeds(mod, name: str, confs, noise, seed: int) -> list[dict]:
    """A Q-Former (BLIP-2, InstructBLIP, Granite-Speech's projector) or another sub-encoder of token ids
    (Evolla's protein encoder) run alone: ``query_embeds`` [b, queries, hidden] attending to
    ``encoder_hidden_states`` [b, n, encoder_hidden_size] (Blip2QFormerModelTester), token ids of its own
    vocabulary, whichever of them its forward takes."""
    import torch
    params = _params(mod)
    hidden = _get(confs, ("hidden_size", "d_model"))
    d: dict = {}
    if name == "input_ids":
        d["input_ids"] = token_inputs(confs[0], seed)["input_ids"][:, : SEQ_LEN // 2]
        if "attention_mask" in params:
            d["attention_mask"] = torch.ones_like(d["input_ids"])
    if "query_embeds" in params and isinstance(hidden, int):
        d["query_embeds"] = noise(1, 4, hidden)
        enc = _get(confs, ("encoder_hidden_size",)) or hidden
        if "encoder_hidden_states" in params and isinstance(enc, int):
            d["encoder_hidden_states"] = noise(1, 10, enc)
    return [d] if name in d else []


def _with_required(mod, inputs: dict) -> dict:
    """``inputs`` with None for every other argument the forward declares without a default (Phi-4-multimodal's
    audio encoder: ``mask: Tensor | None``)."""
    out = dict(inputs)
    for n, p in _params(mod).items():
        if n not in out and p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            out[n] = None
    return out


def first_run(mod, candidates: list[dict]):
    """The first of ``candidates`` that ``mod`` runs on (float64, no grad), or None."""
    import torch

    from .float64 import float64_softmax
    for c in candidates:
        try:
            with torch.no_grad(), float64_softmax():
                mod(**c)
        except Exception:   # noqa: BLE001, S112 - a shape the modeling file does not take: the next candidate
            continue
        return c
    return None


def _first_param(mod) -> str | None:
    for n, p in _params(mod).items():
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            return n
    return None


def tower_input(root, group: str, seed: int = 0):
    """(module, inputs) that run the tower holding ``group`` (a module path, ``{L}`` for the layer index) alone
    on seeded noise, or None.  First the deepest module above the group with a config whose forward takes
    pixels, patches, audio features or a Q-Former's query embeddings (its first argument) and runs on
    candidates from its config (:func:`feeds`): such a forward builds its own positions from its inputs, as
    it does inside the whole model; then a config-less projector fed features (:func:`_bare_input`); last a
    module with a config taking token ids (a sub-encoder of its own vocabulary: Evolla's protein encoder).
    The last comes last because the language model above a projector takes token ids too, and never runs it."""
    parts = group.split(".{L}")[0].split(".")
    found = _config_input(root, parts, seed, ("pixel_values", "hidden_states", "flattened_patches", "patch_embeds",
                                              "input_features", "input_values", "query_embeds"))
    return found or _bare_input(root, parts, seed) or _config_input(root, parts, seed, ("input_ids",))


def _config_input(root, parts: list, seed: int, names: tuple):
    for i in range(len(parts), 0, -1):
        try:
            mod = root.get_submodule(".".join(parts[:i]))
        except AttributeError:
            continue
        if getattr(mod, "config", None) is None:
            continue
        name = _first_param(mod)
        if name is None or name not in names:
            continue
        if name == "hidden_states" and not (any(n in _params(mod) for n in _GRIDS) or _get(_configs(mod), _MEL)):
            continue     # a plain encoder stack's hidden states: its caller's input is the tower's
        found = first_run(mod, [_with_required(mod, _like_params(mod, c)) for c in feeds(mod, name, seed)])
        if found is not None:
            return mod, found
    return None


# forward arguments that carry positions: a module taking one is not run without them (it might skip them)
_POSITIONAL = re.compile(r"pos|rot|rope|cos|sin|grid|spatial|shape|size|seqlen|window", re.I)


def _bare_input(root, parts: list, seed: int):
    """(module, inputs) for a projector with no config of its own that takes one tensor and nothing about
    positions (Kosmos-2.5's image-to-text projection, Aria's projector: latent queries attending to image
    features), run alone on seeded features [1, n, width], or None.  Widths: its linear layers' input
    sizes; lengths: 16 and the patch counts of an int-keyed table it holds (Aria's patch_to_query_dict).
    Attention modules are never run bare: their caller decides their positions."""
    import torch
    g = torch.Generator().manual_seed(seed + 4)
    for i in range(len(parts), 0, -1):
        try:
            mod = root.get_submodule(".".join(parts[:i]))
        except AttributeError:
            continue
        if getattr(mod, "config", None) is not None or type(mod).__name__.endswith("Attention"):
            continue
        params = {n: p for n, p in _params(mod).items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
        if len(required) != 1 or any(_POSITIONAL.search(n) for n in params):
            continue
        widths = list(dict.fromkeys(m.in_features for m in mod.modules() if isinstance(m, torch.nn.Linear)))[:4]
        lengths = [16] + sorted({k for v in vars(mod).values() if isinstance(v, dict) for k in v
                                 if type(k) is int and 0 < k <= 4 * MAX_TOWER_TOKENS})[:3]
        cands = [{required[0]: torch.randn((1, n, w), generator=g, dtype=torch.float64)} for w in widths for n in lengths]
        found = first_run(mod, [_like_params(mod, c) for c in cands])
        if found is not None:
            return mod, found
    return None


def _like_params(mod, inputs: dict) -> dict:
    """``inputs`` with floating tensors in the dtype and on the device of ``mod``'s parameters (the noise is
    float64; a float32 model whose front end does not cast its input, a conformer's subsampling, refuses it)."""
    import torch
    p = next(mod.parameters(), None)
    if p is None:
        return inputs
    return {k: (v.to(p.device, p.dtype) if v.is_floating_point() else v.to(p.device)) if isinstance(v, torch.Tensor)
            else v for k, v in inputs.items()}


def encoder_feed(model, decoder_ids, seed: int = 0) -> tuple[dict | None, str]:
    """(encoder inputs or None, what the encoder reads) for an encoder-decoder ``model`` whose decoder reads
    ``decoder_ids`` ([1, T] long).  None: a text encoder, which reads the decoder's own ids.  Else a speech
    encoder's input: the first seeded candidate of its main input (:func:`feeds`, in the model's dtype and on
    its device) that the model runs; the same ``seed`` gives both models of a comparison the same features,
    and they do not depend on the ids (chosen once, reused for every prompt).  Raises ValueError when no
    candidate runs."""
    main = getattr(model, "main_input_name", "input_ids")
    main = main[0] if isinstance(main, (list, tuple)) else main
    if main == "input_ids":
        return None, "the same token ids"
    cands = [_like_params(model, c) | {"decoder_input_ids": decoder_ids} for c in feeds(model, main, seed, whole=True)]
    found = first_run(model, cands)
    if found is None:
        raise ValueError(f"none of {len(cands)} seeded {main} shapes built from the config runs in {type(model).__name__}")
    feed = {k: v for k, v in found.items() if k != "decoder_input_ids"}
    return feed, "seeded " + ", ".join(f"{k} {list(v.shape)}" for k, v in feed.items()) + " built from the config (no processor)"


def tower_outputs(out):
    """Every floating tensor a tower returns, flattened and joined (a SigLIP pooling head's attention only
    reaches ``pooler_output``, a Qwen-VL merger's output is ``pooler_output`` beside ``last_hidden_state``)."""
    import torch
    if isinstance(out, torch.Tensor):
        return out.reshape(-1)
    vals = out.values() if hasattr(out, "values") else out if isinstance(out, (tuple, list)) else [out]
    flat = []
    for v in vals:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            flat.append(v.reshape(-1))
        elif isinstance(v, (tuple, list)):
            flat += [x.reshape(-1) for x in itertools.chain(v) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    return torch.cat(flat) if flat else torch.zeros(0, dtype=torch.float64)
