"""mace-torch's own LoRA (``mace_run_train --lora``), the nearest peer of ELoRA.

It wraps ``o3.Linear`` (an equivariant bottleneck of ``rank`` copies of each shared irrep), dense
layers and radial-MLP layers, with mace-torch's defaults rank 4, alpha 1, ``A ~ N(0, 1e-3)``; it does
not adapt the skip tensor product nor the symmetric contraction.
"""

from __future__ import annotations

from mace.modules.lora import inject_LoRAs, merge_lora_weights
from torch import nn

from workbench.core.errors import UserError
from workbench.core.method import Method
from workbench.core.options import Option
from workbench.core.registry import methods


@methods.register
class MaceLoRA(Method):
    name = "mace-lora"
    description = "mace-torch's LoRA (o3.Linear, dense and radial layers; rank 4, alpha 1)"
    model_families = ("mace",)
    learning_rate = 1e-2  # mace-torch's default lr; better than 5e-3 on rmd17 validation (50 frames)
    options = (
        Option("rank", int, 4, "LoRA rank of mace-torch's adapters"),
        Option("alpha", float, 1.0, "LoRA alpha of mace-torch's adapters"),
    )

    def __init__(self, **options):
        """The options, checked before any model is seen."""
        super().__init__(**options)
        if self.config["rank"] < 1 or not self.config["alpha"] > 0:
            raise UserError(f"method 'mace-lora': --rank must be a positive integer and --alpha positive, got "
                            f"{self.config['rank']} and {self.config['alpha']}")  # fmt: skip

    def check(self, task, data, model: nn.Module) -> None:
        super().check(task, data, model)
        if any(type(module).__module__.startswith("cuequivariance_torch") for module in model.modules()):
            raise UserError(
                "method 'mace-lora' wraps e3nn's o3.Linear; on the cuEquivariance backend it would adapt the radial "
                "MLP only. Run it with --backend e3nn, or leave it out (--baselines full,readout)"
            )

    def prepare(self, model: nn.Module) -> nn.Module:
        return inject_LoRAs(model, rank=self.config["rank"], alpha=self.config["alpha"])

    def merge(self, model: nn.Module) -> nn.Module:
        return merge_lora_weights(model)
