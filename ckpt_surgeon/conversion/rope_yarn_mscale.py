"""yarn as llama.cpp runs it; DeepSeek's yarn (``mscale`` / ``mscale_all_dim``) <-> GGUF's
``rope.scaling.yarn_log_multiplier``.

llama.cpp 0.3.36 loads no ``rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow`` /
``yarn_attn_factor`` for llama, qwen2, qwen3 or deepseek2 (only grok and mistral3 read them,
``src/models/*.cpp``; llama-context.cpp then takes 32 / 1, and an attention factor of
``0.1 ln factor + 1``, or DeepSeek's, below), although its converter writes them from the
config.  A config (HF -> GGUF) or a file (GGUF -> HF) whose values differ from those is refused:
the converted model would not be the one llama.cpp runs (:func:`check_yarn_as_llamacpp_runs`).

transformers (modeling_deepseek_v2) multiplies cos and sin by ``get_mscale(factor, mscale) /
get_mscale(factor, mscale_all_dim)`` (``_compute_yarn_parameters``; ``get_mscale(s, m) = 0.1 m
ln s + 1``) and the softmax scale by ``get_mscale(factor, mscale_all_dim)**2``
(``yarn_apply_mscale``).  llama.cpp's converter (``DeepseekV2Model.set_gguf_parameters``) writes
only ``yarn_log_multiplier = 0.1 * mscale_all_dim``, and its deepseek2 graph (llama-context.cpp,
src/models/deepseek2.cpp) takes ``mscale = mscale_all_dim`` for the cos/sin ratio (so 1) and
scales ``kq`` by ``(1 + 0.1 mscale_all_dim ln factor)**2``; it ignores ``yarn_attn_factor``.  The two
agree exactly when ``mscale == mscale_all_dim`` (DeepSeek-V2 / V2-Lite: 0.707 both) and no
``attention_factor`` is given; without ``mscale_all_dim`` llama.cpp would scale attention by
``(1 + 0.1 ln factor)**2`` where transformers does not.  Anything else is refused.
"""
from __future__ import annotations

import numpy as np

from ..arch.checked import POSITIVE
from ..errors import UnsupportedError

__all__ = ["LOG_MUL", "yarn_mscale_to_gguf", "yarn_mscale_from_gguf", "check_yarn_as_llamacpp_runs"]

LOG_MUL = "rope.scaling.yarn_log_multiplier"
# what llama.cpp's yarn applies whatever the file says (llama-hparams.h defaults, llama-context.cpp)
_LLAMACPP_BETA = {"beta_fast": 32.0, "beta_slow": 1.0}


def check_yarn_as_llamacpp_runs(values: dict, factor: float, arch: str, *, spelled: dict, path: str | None,
                                mscales: bool = False) -> None:
    """``values``: beta_fast / beta_slow / attention_factor as the source has them (None: absent);
    ``spelled``: how the source names each (a config key or a GGUF key) in the message;
    ``mscales``: DeepSeek's, whose attention factor comes from mscale_all_dim (checked there)."""
    import math
    for key, want in _LLAMACPP_BETA.items():
        v = values.get(key)
        if v is not None and np.float32(v) != np.float32(want):
            raise UnsupportedError(f"{spelled[key]} = {v!r} is not converted (llama.cpp's {arch} does not load it "
                                   f"and runs {want:g})", path=path)
    af = values.get("attention_factor")
    if af is not None and not mscales:
        want = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        if np.float32(af) != np.float32(want):
            raise UnsupportedError(f"{spelled['attention_factor']} = {af!r} is not converted (llama.cpp's {arch} "
                                   f"does not load it and applies 0.1 ln(factor) + 1 = {want:.6g})", path=path)


def yarn_mscale_to_gguf(rp: dict, arch: str, path: str | None) -> list[tuple[str, float]]:
    """``[(key, value)]`` for a DeepSeek yarn config's mscales, refusing what llama.cpp runs otherwise."""
    if rp.get("attention_factor") is not None:
        raise UnsupportedError(f"rope_parameters.attention_factor = {rp['attention_factor']!r} is not converted "
                               f"(llama.cpp's {arch} ignores yarn_attn_factor and derives the factor from "
                               "mscale_all_dim)", path=path)
    ms, ma = rp.get("mscale"), rp.get("mscale_all_dim")
    if not ma:
        raise UnsupportedError(f"a yarn RoPE without rope_parameters.mscale_all_dim is not converted (llama.cpp's "
                               f"{arch} would scale attention by (1 + 0.1 ln factor)^2 where transformers does not)",
                               path=path)
    ma = POSITIVE.check("rope_parameters.mscale_all_dim", ma, path=path)
    if ms is None or POSITIVE.check("rope_parameters.mscale", ms, path=path) != ma:
        raise UnsupportedError(f"rope_parameters.mscale = {ms!r} with mscale_all_dim = {ma:g} is not converted "
                               f"(llama.cpp's {arch} takes mscale_all_dim for both, so cos and sin would be scaled "
                               "differently)", path=path)
    return [(f"{arch}.{LOG_MUL}", 0.1 * ma)]


def yarn_mscale_from_gguf(log_mul: float | None, arch: str, path: str | None) -> dict:
    """transformers' ``mscale`` / ``mscale_all_dim`` for llama.cpp's ``yarn_log_multiplier``
    (shortest decimal that writes the same float32 back, as configs spell it: 0.707)."""
    if log_mul is None:
        raise UnsupportedError(f"a yarn file without {arch}.{LOG_MUL} is not converted (llama.cpp's {arch} then "
                               "scales attention by (1 + 0.1 ln factor)^2, which no transformers config says)",
                               path=path)
    exact = float(np.float32(log_mul)) / 0.1
    for digits in range(1, 18):
        m = float(f"{exact:.{digits}g}")
        if np.float32(0.1 * m) == np.float32(log_mul):
            break
    else:
        m = exact
    return {"mscale": m, "mscale_all_dim": m}
