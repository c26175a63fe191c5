"""MACE interatomic potentials (mace-torch): build, save as safetensors, load, and drive ASE.

Paper: Batatia et al., "MACE: Higher Order Equivariant Message Passing Neural Networks for Fast and
Accurate Force Fields", NeurIPS 2022.

The shipped foundation model (``checkpoints/mace_xtb_small.safetensors`` + ``.json``) is a small MACE
pretrained on GFN2-xTB molecular dynamics of H/C/N/O molecules (``workbench pretrain --domain rmd17``;
card ``data_cards/mace-xtb-small.yaml``). Checkpoints of the workbench are safetensors plus a JSON of
hyper-parameters, never pickles. A user's MACE ``.model`` file (MACE-OFF, MACE-MP) is a full pickle
and loads only with ``trust_checkpoint=True``.

Units: positions Å, energies eV, forces eV/Å.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch
from e3nn import o3
from mace import modules
from mace.modules.wrapper_ops import CUET_AVAILABLE
from torch import nn
from workbench.models.potentials import atomic_numbers_of, set_atomic_energies  # noqa: F401  (this module's API too)

from workbench.core.checkpoint import load_model, save_tensors, write_json
from workbench.core.device import device_of
from workbench.core.errors import UserError
from workbench.core.model import ModelFamily, ModelSpec
from workbench.core.registry import models

SHIPPED_CHECKPOINT = Path(__file__).parent / "checkpoints" / "mace_xtb_small.safetensors"

#: Architecture of the shipped foundation model: small enough to fine-tune on a laptop CPU.
FOUNDATION_ARCHITECTURE: dict[str, Any] = {
    "r_max": 5.0,
    "num_bessel": 8,
    "num_polynomial_cutoff": 5,
    "max_ell": 2,
    "num_interactions": 2,
    "hidden_irreps": "64x0e + 64x1o",
    "MLP_irreps": "16x0e",
    "correlation": 3,
    "radial_MLP": [64, 64, 64],
    "interaction": "RealAgnosticResidualInteractionBlock",
    "atomic_numbers": [1, 6, 7, 8],
    "use_reduced_cg": False,
}

#: What a MACE model declares to the methods: its per-element readouts are the head.
SPEC = ModelSpec(family="mace", head="readouts")

#: Architecture keys with a default for checkpoints written before they were stored. ``use_reduced_cg``: the
#: symmetric contraction's basis; mace-torch defaults it to True but applies it only when cuequivariance is
#: installed, so the same arguments build other weight shapes on other machines. The workbench always passes it
#: explicitly and stores it; checkpoints without it were built without cuequivariance, i.e. with False.
OPTIONAL = ("use_reduced_cg",)

#: Keys `build_mace` needs beyond the architecture (they come from the pretraining data).
DATA_STATISTICS = ("atomic_energies", "avg_num_neighbors", "atomic_inter_scale", "atomic_inter_shift")


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily set torch's default dtype (MACE computes its constant buffers in it)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_mace(hparams: Mapping[str, Any]) -> modules.ScaleShiftMACE:
    """A fresh ``ScaleShiftMACE`` in float64 from `FOUNDATION_ARCHITECTURE`-style hyper-parameters.

    ``hparams`` also holds `DATA_STATISTICS`: ``atomic_energies`` (E0 per entry of
    ``atomic_numbers``, eV), ``avg_num_neighbors``, and the scale (eV) and shift (eV) of the
    per-atom interaction energy.
    """
    missing = [
        key for key in (*FOUNDATION_ARCHITECTURE, *DATA_STATISTICS) if key not in hparams and key not in OPTIONAL
    ]
    if missing:
        raise UserError(f"MACE hyper-parameters lack {missing}")
    use_reduced_cg = bool(hparams.get("use_reduced_cg", False))
    if use_reduced_cg and not CUET_AVAILABLE:
        raise UserError(
            "MACE hyper-parameter 'use_reduced_cg': true needs cuequivariance "
            "(pip install 'sciadapt-workbench[cueq]'); "
            "without it mace-torch silently builds the full Clebsch-Gordan basis, whose weights have other shapes"
        )
    interaction = modules.interaction_classes[hparams["interaction"]]
    with default_dtype(torch.float64):
        model = modules.ScaleShiftMACE(
            r_max=hparams["r_max"],
            num_bessel=hparams["num_bessel"],
            num_polynomial_cutoff=hparams["num_polynomial_cutoff"],
            max_ell=hparams["max_ell"],
            interaction_cls=interaction,
            interaction_cls_first=interaction,
            num_interactions=hparams["num_interactions"],
            num_elements=len(hparams["atomic_numbers"]),
            hidden_irreps=o3.Irreps(hparams["hidden_irreps"]),
            MLP_irreps=o3.Irreps(hparams["MLP_irreps"]),
            atomic_energies=np.asarray(hparams["atomic_energies"], dtype=np.float64),
            avg_num_neighbors=hparams["avg_num_neighbors"],
            atomic_numbers=list(hparams["atomic_numbers"]),
            correlation=hparams["correlation"],
            gate=torch.nn.functional.silu,
            radial_MLP=list(hparams["radial_MLP"]),
            atomic_inter_scale=hparams["atomic_inter_scale"],
            atomic_inter_shift=hparams["atomic_inter_shift"],
            use_reduced_cg=use_reduced_cg,
        )
    return declare(model)


def declare(model: nn.Module) -> nn.Module:
    """Give a mace-torch model (a class the workbench does not own) its `ModelSpec`; returns it."""
    model.workbench_spec = SPEC
    return model


def save_mace(
    model: nn.Module, hparams: Mapping[str, Any], path: str | Path, provenance: Mapping[str, Any] | None = None
) -> None:
    """Write ``path`` (safetensors state dict) and ``path.json`` (hyper-parameters and provenance)."""
    path = Path(path)
    save_tensors(path, model.state_dict(), metadata={"format": "workbench-mace"})
    write_json(path.with_suffix(".json"), {"hparams": dict(hparams), "provenance": dict(provenance or {})})


def load_mace(
    source: str | Path | None = None, *, trust_checkpoint: bool = False, dtype: torch.dtype = torch.float64
) -> nn.Module:
    """Load a MACE model: a workbench ``.safetensors`` (+ ``.json``) or, if trusted, a MACE ``.model``.

    Args:
        source: checkpoint path; None loads the shipped foundation model.
        trust_checkpoint: allow a full-pickle ``.model`` file (it can run arbitrary code when loaded).
        dtype: float64 (default, as MACE-OFF) or float32.
    """
    path = Path(source) if source is not None else SHIPPED_CHECKPOINT
    if not path.is_file():
        raise UserError(f"{path}: no such model file")
    if path.suffix == ".safetensors":
        model = load_model(  # the .json beside it is `save_mace`'s
            path,
            lambda saved: build_mace(saved["hparams"]),
            "a workbench MACE checkpoint",
            "{'hparams': {MACE hyper-parameters}, 'provenance': {...}}",
        )
    elif path.suffix == ".model" or path.suffix == ".pt":
        if not trust_checkpoint:
            raise UserError(
                f"{path}: a MACE .model file is a full pickle that can run code when loaded; "
                "pass --trust-checkpoint (Python: trust_checkpoint=True) if you trust its origin"
            )
        try:
            model = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as error:
            raise UserError(f"{path}: cannot be loaded as a MACE model ({error})") from None
        if not isinstance(model, nn.Module) or not hasattr(model, "atomic_numbers"):
            raise UserError(f"{path}: holds a {type(model).__name__}, not a MACE model")
        declare(model)
    else:
        raise UserError(
            f"{path}: unknown model format '{path.suffix}'; expected .safetensors (+ .json) or a MACE .model"
        )
    return model.to(dtype).eval()


def to_cueq(model: nn.Module) -> nn.Module:
    """The same MACE on cuEquivariance's tensor products (mace-torch's ``convert_e3nn_cueq``); a new model.

    Every e3nn ``Linear``, the skip tensor product, the channel-wise convolution and the symmetric contraction become
    cuequivariance-torch modules, in the ``ir_mul`` layout, with the weights carried over. On a GPU they run
    cuequivariance's CUDA kernels (package ``cuequivariance-ops-torch-cu12``), the convolution fused with its scatter
    sum; on a CPU its pure-PyTorch ``naive`` method, which gives the same numbers (tested to 1e-10 in float64).

    Each converted symmetric contraction keeps, as ``elora_blocks``, the layout of its one weight tensor in e3nn's
    terms (which rows are the highest-order weights of which output irrep), so that ELoRA can adapt it as it adapts
    the e3nn model (`workbench.adaptation.elora`). ``model`` must be plain: merge adapters first.
    """
    if not CUET_AVAILABLE:
        raise UserError(
            "--backend cueq needs cuequivariance: pip install 'sciadapt-workbench[cueq]' "
            "(and on a GPU 'sciadapt-workbench[cueq-cuda]')"
        )
    if any(torch.nn.utils.parametrize.is_parametrized(module) for module in model.modules()):
        raise UserError("to_cueq: the model carries adapters; merge them first (the converter copies plain weights)")
    import cuequivariance as cue
    from mace.cli.convert_e3nn_cueq import run as convert
    from mace.tools.cg import O3_e3nn
    from mace.tools.cg_cueq_tools import symmetric_contraction_proj

    parameter = next(model.parameters())
    reduced = bool(getattr(model, "use_reduced_cg", False))
    with default_dtype(parameter.dtype):  # the converter sets torch's default dtype for good otherwise
        converted = convert(model, device=parameter.device.type, return_model=True, layout="ir_mul")
    for source, target in zip(model.products, converted.products):
        contraction = source.symmetric_contractions
        blocks = []
        for contraction_k in contraction.contractions:
            for suffix, weight in (("max", contraction_k.weights_max), *enumerate(contraction_k.weights)):
                flag = getattr(contraction_k, f"weights_{suffix}_zeroed", None)
                if not (flag is not None and bool(flag)) or reduced:  # the converter skips zeroed weights
                    blocks.append((suffix == "max", int(weight.shape[1])))
        projection = None
        if reduced:
            irreps_in = o3.Irreps(str(irrep.ir) for irrep in contraction.irreps_in)
            irreps_out = o3.Irreps(str(irrep.ir) for irrep in contraction.irreps_out)
            _, proj = symmetric_contraction_proj(
                cue.Irreps(O3_e3nn, str(irreps_in)),
                cue.Irreps(O3_e3nn, str(irreps_out)),
                list(range(1, contraction.contractions[0].correlation + 1)),
            )
            projection = torch.as_tensor(proj, dtype=parameter.dtype)
        weight = target.symmetric_contractions.weight
        if sum(rows for _, rows in blocks) != (weight.shape[1] if projection is None else projection.shape[0]):
            raise UserError(
                f"to_cueq: the converted symmetric contraction's weight {tuple(weight.shape)} does not match "
                f"e3nn's blocks {blocks}"
            )
        target.symmetric_contractions.elora_blocks = blocks
        target.symmetric_contractions.elora_projection = projection
    return declare(converted.to(parameter.dtype).eval())


def calculator(model: nn.Module, device: str | torch.device | None = None):
    """An ASE calculator (mace-torch's ``MACECalculator``) that drives MD with ``model`` on ``device`` (default:
    where the model is).

    ``model`` must be plain (adapters merged): use `workbench.Run.calculator` for a run's model.
    """
    from mace.calculators import MACECalculator

    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # set again by mace.calculators (see workbench/__init__)
    dtype = "float64" if next(model.parameters()).dtype == torch.float64 else "float32"
    where = device_of(model) if device is None else torch.device(device)
    return MACECalculator(models=model, device=str(where), default_dtype=dtype)


@models.register
class Mace(ModelFamily):
    """MACE from mace-torch; the shipped foundation is ``mace_xtb_small`` (GFN2-xTB, H/C/N/O)."""

    name = "mace"
    description = "MACE equivariant interatomic potential (mace-torch); shipped: small GFN2-xTB foundation model"
    card = "mace-xtb-small"

    def load(self, source=None, *, trust_checkpoint=False, **sizes) -> nn.Module:
        return load_mace(source, trust_checkpoint=trust_checkpoint)

    def files(self, source=None) -> list[Path]:
        path = Path(source) if source is not None else SHIPPED_CHECKPOINT
        return [path, path.with_suffix(".json")] if path.suffix == ".safetensors" else [path]
