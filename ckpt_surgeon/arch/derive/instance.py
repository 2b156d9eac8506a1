"""The float64 random instance a probe runs: the shrunken config built as the checkpoint's own class.

:func:`random_instance` builds it (seeded init, biases drawn with std 0.5 so no bias claim is vacuous);
:class:`ProbeInstance` holds it with its seeded inputs (:mod:`.feeds`), a baseline forward pass under the
float64 guards (:mod:`.float64`) and cheap trial edits (``edit``: apply, measure the relative logit change,
restore).  torch and transformers are imported only inside functions.
"""
from __future__ import annotations

import contextlib
import types

from .feeds import model_inputs, tower_input, tower_outputs
from .float64 import float64_softmax
from .modtree import MHA_IN_PROJ, Block, module_path

PROBE_MAX_PARAMS = 20_000_000    # float64: 160 MB; a probe instance is a few 100k parameters
_BIAS_STD = 0.5


def meta_params(klass, conf) -> int:
    """Parameter count of ``klass(conf)`` without allocating it (meta device)."""
    import torch

    from ...quiet import quiet_transformers
    with quiet_transformers(), torch.device("meta"):
        return sum(p.numel() for p in klass(conf).parameters())


def random_instance(cfg: dict, klass, *, seed: int = 0, max_params: int = PROBE_MAX_PARAMS):
    """(config, float64 eval-mode model) of ``klass`` with seeded init and every 1-D ``*.bias``
    drawn with std 0.5 (transformers' init zeroes biases, which would make any bias claim vacuous)."""
    import torch

    from ...quiet import quiet_transformers
    from .modtree import config_object
    conf = config_object(cfg)
    n = meta_params(klass, conf)
    if n > max_params:
        raise ValueError(f"the shrunken instance would still have {n:,} parameters (> {max_params:,})")
    torch.manual_seed(seed)
    with quiet_transformers():
        model = klass(conf)
    model = model.to(torch.float64).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * _BIAS_STD)
        # convolutions get variance-preserving weights (std 1 / sqrt(fan-in), as trained front ends roughly have):
        # at transformers' std 0.02 each conv shrinks its input ~20x, a conformer's subsampling stack then passes
        # the biases alone and every audio frame reaches attention as the same vector (nothing to probe)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.conv._ConvNd):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g, dtype=torch.float64) / fan_in ** 0.5)
    return conf, model


def first_output(out):
    """Logits when the model has a head, else its first output tensor."""
    t = getattr(out, "logits", None)
    return out[0] if t is None else t


class ProbeInstance:
    """A float64 random instance with a baseline forward pass and cheap trial edits."""

    def __init__(self, cfg: dict, klass, seed: int = 0):
        import torch
        self.torch = torch
        self.conf, self.model = random_instance(cfg, klass, seed=seed, max_params=PROBE_MAX_PARAMS)
        self.root = self.model       # module paths are relative to it; ``model`` is what ``run`` calls
        self.outputs = first_output
        self.inputs = model_inputs(self.conf, seed, self.model)
        self.base = self.run()
        self.scale = float(self.base.abs().max()) or 1.0

    def run(self):
        with self.torch.no_grad(), float64_softmax():
            out = self.model(**self.inputs)
        return self.outputs(out).detach().clone()

    def rel(self) -> float:
        return float((self.run() - self.base).abs().max()) / self.scale

    def module(self, b: Block, role: str):
        rel = b.role(role)
        if rel == MHA_IN_PROJ:      # nn.MultiheadAttention: its fused projection's parameters, as a module has them
            mha = self.root.get_submodule(b.path)
            return types.SimpleNamespace(weight=mha.in_proj_weight, bias=mha.in_proj_bias)
        return self.root.get_submodule(module_path(b.path, rel))

    def tower(self, group: str) -> "ProbeInstance | None":
        """The same instance, run through the vision tower holding ``group`` on random pixels
        (a token-id forward never runs it), or None (see :func:`tower_input`)."""
        found = tower_input(self.root, group)
        return None if found is None else self.view(found[0], found[1], tower_outputs)

    def view(self, model, inputs: dict, outputs) -> "ProbeInstance":
        """The same instance (module paths relative to the same root), run as ``model(**inputs)`` with
        ``outputs`` taken from its result, its baseline computed."""
        view = object.__new__(ProbeInstance)
        view.torch, view.root = self.torch, self.root
        view.model, view.inputs, view.outputs = model, inputs, outputs
        view.conf = getattr(model, "config", None)
        view.base = view.run()
        view.scale = float(view.base.abs().max()) or 1.0
        return view

    @contextlib.contextmanager
    def patched(self, changes):
        """Inside: ``[(tensor, new value)]`` applied; restored on exit."""
        saved = [(t, t.detach().clone()) for t, _ in changes]
        try:
            with self.torch.no_grad():
                for t, v in changes:
                    t.copy_(v)
            yield
        finally:
            with self.torch.no_grad():
                for t, v in saved:
                    t.copy_(v)

    def edit(self, changes) -> float:
        """Apply ``[(tensor, new value)]``, measure ``rel``, restore."""
        with self.patched(changes):
            return self.rel()
