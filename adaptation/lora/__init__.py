"""LoRA for every non-equivariant model: config, layer and model sides, as HF PEFT's ``tuners/lora``.

Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022 (with PEFT's options rsLoRA,
PiSSA and DoRA, and RepLoRA and Flat-LoRA: `workbench.adaptation.lora.config`). Each target ``nn.Linear``,
``nn.Conv1d`` or ``nn.Conv2d`` becomes a `LoraLayer` computing ``W x + b + (alpha / r) · B A dropout(x)``, with
PEFT's parameter names and file layout, so adapters move between the workbench and PEFT. One layer holds several
named adapters (PEFT's ``lora_A[name]``), each of a kind: plain LoRA, H-LoRA's token-routed fused experts, or
MoELoRA's looped experts.

- `apply` / `apply_config` (`check_config`: what they would refuse, the model left as it is), `add_adapter`,
  `set_adapter`, `delete_adapter`, `merge`, `unmerge`, `save_adapter`, `load_adapter`, `set_adapter_weights`,
  `adapter_parameters`, `adapter_state`, `lora_layers`, `init_lora_one` (`workbench.adaptation.lora.model`);
- `LoraLayer` (`workbench.adaptation.lora.layer`), a dispatcher to each adapter's variants;
- `variants`: the refinements (routed kinds, GOAT, PiSSA, LoRA-One, RepLoRA, DoRA, rsLoRA, Flat-LoRA) as variant
  objects that LoRA layers and ELoRA's blocks share, and their registry (`workbench.adaptation.lora.variants`);
- `apply_plugins`, `active_plugin`, `save_plugin`, `load_plugin`: named adapters chosen by task kind (HealthGPT's
  heterogeneous H-LoRA / MoELoRA / LoRA plug-ins) (`workbench.adaptation.lora.plugins`);
- `LoraConfig`, `AdapterConfig` (= ``PluginConfig``), `conv_rule_rank` (`workbench.adaptation.lora.config`);
- `flat`: Flat-LoRA's seeded perturbations of the merged weights (`workbench.adaptation.lora.flat`);
- `LoadReport`, and the adapter-file helpers ELoRA shares (`workbench.adaptation.lora.io`);
- the workbench method ``lora`` (`workbench.adaptation.lora.method.LoRA`).

Example::

    >>> from workbench.adaptation import lora
    >>> model = lora.apply(model, targets=["qkv"], rank=8)   # doctest: +SKIP
    >>> plain = lora.merge(model)                            # doctest: +SKIP
"""

from workbench.adaptation.lora.config import (
    COMPUTES,
    CONV_RANKS,
    INITS,
    KINDS,
    OBJECTIVES,
    REPARAMS,
    SCALINGS,
    AdapterConfig,
    LoraConfig,
    conv_rule_rank,
)
from workbench.adaptation.lora.io import LoadReport
from workbench.adaptation.lora.layer import DEFAULT, SUPPORTED, LoraLayer
from workbench.adaptation.lora.method import LoRA
from workbench.adaptation.lora.model import (
    adapter_parameters,
    adapter_state,
    add_adapter,
    apply,
    apply_config,
    check_config,
    delete_adapter,
    init_lora_one,
    load_adapter,
    load_state,
    lora_layers,
    merge,
    peft_config_of,
    save_adapter,
    set_adapter,
    set_adapter_weights,
    unmerge,
)
from workbench.adaptation.lora.plugins import (
    PluginConfig,
    active_plugin,
    apply_plugins,
    load_plugin,
    plugin_names,
    plugin_parameters,
    plugin_state,
    save_plugin,
)

__all__ = [
    "COMPUTES",
    "CONV_RANKS",
    "DEFAULT",
    "INITS",
    "KINDS",
    "OBJECTIVES",
    "REPARAMS",
    "SCALINGS",
    "SUPPORTED",
    "AdapterConfig",
    "LoRA",
    "LoadReport",
    "LoraConfig",
    "LoraLayer",
    "PluginConfig",
    "add_adapter",
    "adapter_parameters",
    "adapter_state",
    "active_plugin",
    "apply_plugins",
    "delete_adapter",
    "init_lora_one",
    "load_plugin",
    "load_state",
    "plugin_names",
    "plugin_parameters",
    "plugin_state",
    "save_plugin",
    "set_adapter",
    "apply",
    "apply_config",
    "check_config",
    "conv_rule_rank",
    "load_adapter",
    "lora_layers",
    "merge",
    "peft_config_of",
    "save_adapter",
    "set_adapter_weights",
    "unmerge",
]
