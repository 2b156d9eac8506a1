"""Float64 forward passes of transformers' modeling code: the guards that keep them float64.

Used by the probe (:mod:`.probe`) and by the inputs of a forward pass (:mod:`.feeds`), which tries
candidate inputs under the same guards the probe then runs with.
"""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def float64_softmax():
    """Keep softmax in float64 while probing.

    transformers' eager attention asks for ``softmax(..., dtype=torch.float32)`` (a guard for
    fp16/bf16 inputs, e.g. modeling_opt / modeling_stablelm ``eager_attention_forward``); on a
    float64 probe that request is a *downcast* that adds ~1e-8 of rounding noise and would hide
    an exact invariance.  Inside this context a float32 request on a float64 input is dropped;
    every other call is untouched.

    Likewise ``torch.full((), torch.finfo(x.dtype).min)`` without a dtype (modeling_xglm
    ``XGLMAttention`` clamping the masked weights) is a float32 tensor, and float64's min does not
    fit one: such a call (no dtype, a finite fill beyond float32's range) gets float64 instead of
    raising.  Every call float32 can hold is untouched.

    And a float32 operand of ``F.linear`` next to a float64 one (a modeling file's fp32 guard that
    downcasts on a float64 model: modeling_inkling2 ``Inkling2TopKRouter`` routes ``hidden.float()``
    through its weight, modeling_mra runs its attention in ``.float()`` and feeds the result to a
    Linear) is promoted to float64, as torch promotes elementwise ops, instead of raising; calls with
    one dtype are untouched.
    """
    import torch
    nnf = torch.nn.functional
    orig_f, orig_t, orig_m = nnf.softmax, torch.softmax, torch.Tensor.softmax
    orig_full, orig_linear = torch.full, nnf.linear
    f32_max = torch.finfo(torch.float32).max

    def full(size, fill_value, *args, **kwargs):
        if (not args and kwargs.get("dtype") is None and kwargs.get("out") is None and isinstance(fill_value, float)
                and f32_max < abs(fill_value) < float("inf")):
            kwargs["dtype"] = torch.float64
        return orig_full(size, fill_value, *args, **kwargs)

    def linear(input, weight, bias=None):   # noqa: A002
        if input.dtype != weight.dtype and {input.dtype, weight.dtype} == {torch.float32, torch.float64}:
            input, weight = input.double(), weight.double()
            bias = bias.double() if bias is not None else None
        return orig_linear(input, weight, bias)

    def keep(x, dtype):
        return None if (dtype == torch.float32 and getattr(x, "dtype", None) == torch.float64) else dtype

    def f(input, dim=None, _stacklevel=3, dtype=None):   # noqa: A002 - torch's own argument name
        return orig_f(input, dim=dim, dtype=keep(input, dtype))

    def t(input, dim, dtype=None):   # noqa: A002
        return orig_t(input, dim, dtype=keep(input, dtype))

    def m(self, dim, dtype=None):
        return orig_m(self, dim, dtype=keep(self, dtype))
    nnf.softmax, torch.softmax, torch.Tensor.softmax, torch.full, nnf.linear = f, t, m, full, linear
    try:
        yield
    finally:
        nnf.softmax, torch.softmax, torch.Tensor.softmax = orig_f, orig_t, orig_m
        torch.full, nnf.linear = orig_full, orig_linear
