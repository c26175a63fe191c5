"""The Model plug-in kind, and what a model declares so that methods can ask for it.

A model family (in ``models/``) builds or loads a backbone. Every model it returns carries a `ModelSpec`
as its ``workbench_spec`` attribute (a class attribute or property of the model's class, or set on the instance
by the family for a class it does not own). Methods never probe a model with ``getattr``: they call
`require`, which names what is missing, and the run calls it (through `workbench.core.method.Method.check`) before
the run directory appears.

Example::

    >>> spec = require(model, "METHOD", "adapter_target_groups")          # doctest: +SKIP
    >>> spec.adapter_target_groups                                        # doctest: +SKIP
    {'conv': ('stem.*',), 'attention': ('layers.*.attention.*',), ...}
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping, Sequence

from torch import nn

from workbench.core.errors import UserError


@dataclass(frozen=True)
class SignalSpec:
    """A model of sampled signals, in the vocabulary signal-model libraries share (``n_chans``, ``n_outputs``,
    ``n_times``, ``sfreq``).

    Args:
        n_chans: input channels (sensors, electrodes).
        n_outputs: output logits.
        n_times: samples per input window the model was built for.
        sfreq: sampling rate the model expects [Hz].
        chs_info: one ``{"ch_name": ...}`` per input channel, in input order (None when the channels have no names).
    """

    n_chans: int
    n_outputs: int
    n_times: int
    sfreq: float
    chs_info: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """What a model declares to the methods.

    Args:
        family: the registered model family that built it (`workbench list` shows them).
        head: module name of the output head (a classifier or the readouts) — trained in full by head-tuning and
            the adapter methods that ask for it.
        adapter_target_groups: named groups of fnmatch patterns over module names (``{"qkv":
            ("blocks.*.attn.qkv",)}``) that low-rank adapter methods adapt; empty when the model offers none.
        embedding: name of a model method ``inputs -> features (batch, d)`` (what the head reads).
        signal: `SignalSpec` for models of sampled signals.
    """

    family: str
    head: str | None = None
    adapter_target_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    embedding: str | None = None
    signal: SignalSpec | None = None


#: What a method may ask a model for (`require`), with the words used in messages.
NEEDS = {
    "head": "an output head",
    "adapter_target_groups": "adapter target groups",
    "embedding": "an embedding hook",
    "signal": "signal shape information (n_chans, n_outputs, n_times, sfreq, chs_info)",
}


def spec_of(model: nn.Module) -> ModelSpec | None:
    """The `ModelSpec` a model declares (through a DDP wrapper too), or None."""
    model = getattr(model, "module", model) if isinstance(model, nn.parallel.DistributedDataParallel) else model
    spec = getattr(model, "workbench_spec", None)
    return spec if isinstance(spec, ModelSpec) else None


def require(model: nn.Module, method: str, *needs: str, families: tuple[str, ...] = ()) -> ModelSpec:
    """The model's `ModelSpec`, after checking it is of one of ``families`` (if given) and declares ``needs``.

    Raises a `UserError` naming the method, the model and what it lacks.
    """
    spec = spec_of(model)
    what = type(model).__name__
    if spec is None:
        raise UserError(
            f"method '{method}': the model ({what}) declares nothing to the workbench (no workbench_spec); load it "
            "through a registered model family (`workbench list`)"
        )
    if families and spec.family not in families:
        raise UserError(
            f"method '{method}' adapts {' or '.join(families)} models; this model ({what}) is of the "
            f"{spec.family} family"
        )
    for need in needs:
        if need not in NEEDS:
            raise ValueError(f"unknown model declaration '{need}'; known: {sorted(NEEDS)}")
        if not getattr(spec, need):
            raise UserError(f"method '{method}' needs {NEEDS[need]}; the {spec.family} model ({what}) declares none")
    return spec


class ModelFamily:
    """A kind of backbone: loads a pretrained checkpoint (or the shipped one), or builds a fresh model.

    ``load`` gets the task's data-dependent sizes as keyword arguments (``in_features``, ``n_classes``, ...): a
    family without a shipped checkpoint builds a fresh model from them when ``source`` is None, and every family
    checks a loaded checkpoint against the sizes it knows. Every model returned declares a `ModelSpec`.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    #: Card (in ``data_cards/``) of the shipped pretrained checkpoint and the data it was trained on.
    card: ClassVar[str | None] = None

    def load(self, source: str | Path | None = None, *, trust_checkpoint: bool = False, **sizes: Any) -> nn.Module:
        """The pretrained model at ``source`` (the shipped checkpoint, or a fresh model of ``sizes``, when None)."""
        raise NotImplementedError

    def files(self, source: str | Path | None = None) -> list[Path]:
        """The files of the model at ``source`` (the shipped one when None), hashed in prediction records."""
        return [] if source is None else [Path(source)]


#: The attribute in which a method that adds adapters chosen per input (plug-ins: one per task kind, say) lists
#: their names on the model (a tuple of str; absent or empty: no plug-ins).
PLUGINS = "adapter_plugins"


def plugins_of(model: nn.Module) -> tuple[str, ...]:
    """The names of the plug-ins (adapters chosen per input) a method gave ``model``."""
    return tuple(getattr(model, PLUGINS, ()))


@contextmanager
def active_adapters(model: nn.Module, names: str | Sequence[str]) -> Iterator[None]:
    """Within the block every adapter layer of ``model`` (a module that wraps a ``base_layer`` and has
    ``set_adapter`` and ``active_adapters``: the tuner-layer convention every adapter layer here follows) uses the
    adapters ``names`` (() for none: the base model); the previous choice comes back after."""
    layers = [m for m in model.modules() if hasattr(m, "base_layer") and hasattr(m, "active_adapters")
              and callable(getattr(m, "set_adapter", None))]  # fmt: skip
    before = [layer.active_adapters for layer in layers]
    for layer in layers:
        layer.set_adapter(names)
    try:
        yield
    finally:
        for layer, chosen in zip(layers, before):
            layer.set_adapter(chosen)
