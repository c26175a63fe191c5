"""A multilayer perceptron over fixed feature vectors (users' embeddings, tabular measurements).

``FeatureNet`` standardises its input with stored statistics, maps it through ``hidden`` ReLU layers to
learned features, and a linear head gives class logits or regression values. With ``hidden=()`` it is
a linear model (features = standardised inputs), the classic setting of importance weighting under
covariate shift, where a misspecified model makes *where* it is fitted matter (Shimodaira, 2000).

Checkpoints are safetensors plus a JSON of the architecture (``save_feature_net`` / ``load_feature_net``).

Shapes:
    x (batch, in_features) → features (batch, hidden[-1] or in_features) → output (batch, n_outputs)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from workbench.core.checkpoint import check_architecture, load_model, save_model, saved_model_files
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec
from workbench.core.registry import models


class FeatureNet(nn.Module):
    """Standardise → ``hidden`` ReLU layers (the learned features) → linear head.

    Args:
        in_features: input dimension d.
        n_outputs: classes (logits) or regression targets.
        hidden: widths of the hidden layers; () makes a linear model.
    """

    #: What the model declares to the methods (`workbench.core.model.ModelSpec`).
    workbench_spec = ModelSpec(family="mlp", head="head", embedding="features")

    def __init__(self, in_features: int, n_outputs: int, hidden: Sequence[int] = (64, 64)):
        super().__init__()
        self.architecture = {"in_features": int(in_features), "n_outputs": int(n_outputs), "hidden": list(hidden)}
        self.register_buffer("input_mean", torch.zeros(in_features))
        self.register_buffer("input_scale", torch.ones(in_features))
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, n_outputs)

    def set_standardisation(self, mean: torch.Tensor, scale: torch.Tensor) -> None:
        """Inputs are mapped to ``(x − mean) / scale`` before the first layer."""
        self.input_mean.copy_(torch.as_tensor(mean, dtype=self.input_mean.dtype))
        self.input_scale.copy_(torch.as_tensor(scale, dtype=self.input_scale.dtype).clamp_min(1e-12))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Learned features (batch, width) of inputs x (batch, in_features)."""
        return self.body((x - self.input_mean) / self.input_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits or values (batch, n_outputs)."""
        return self.head(self.features(x))


def save_feature_net(model: FeatureNet, path: str | Path) -> None:
    """Weights to ``path`` (.safetensors) and the architecture to the ``.json`` beside it."""
    save_model(model, path, "mlp")


def load_feature_net(path: str | Path) -> FeatureNet:
    """A `FeatureNet` saved by `save_feature_net` (safetensors + the JSON of its architecture)."""
    return load_model(
        path,
        lambda a: FeatureNet(a["in_features"], a["n_outputs"], a["hidden"]),
        "an MLP checkpoint",
        "{'in_features': int, 'n_outputs': int, 'hidden': [int, ...]}",
    )


@models.register
class MLPFamily(ModelFamily):
    """`FeatureNet`: a saved checkpoint, or (no ``source``) a fresh net of ``in_features``, ``n_outputs`` and
    ``hidden``.
    """

    name = "mlp"
    description = "Multilayer perceptron over feature vectors (linear model with no hidden layer)"

    def load(self, source: str | Path | None = None, *, trust_checkpoint: bool = False, **sizes) -> FeatureNet:
        if source is None:
            if not {"in_features", "n_outputs"} <= set(sizes):
                raise UserError("the mlp family ships no pretrained checkpoint; build one for a task's data")
            return FeatureNet(sizes["in_features"], sizes["n_outputs"], sizes.get("hidden", (64, 64)))
        model = load_feature_net(source)
        check_architecture(source, model.architecture, sizes, ("in_features", "n_outputs"))
        return model

    def files(self, source=None) -> list[Path]:
        return [] if source is None else saved_model_files(source)
