"""cuEquivariance backend of MACE: the converted model, with and without ELoRA, equals e3nn's (float64, CPU naive).

Also the checkpoint hazard it brought: mace-torch builds other weight shapes when cuequivariance is installed
unless ``use_reduced_cg`` is given explicitly, so the shipped checkpoint must load the same either way.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import EMBEDDED_RMD17, ROOT, energy_forces, outputs_on, randomize_trainable, small_mace
from workbench.adaptation import elora
from workbench.models.mace import load_mace

from workbench.core.errors import UserError
from workbench.core.testing import assert_merge_equivalent, assert_rotation_equivariant

cuet = pytest.importorskip("cuequivariance_torch")
from workbench.models.mace import to_cueq  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:cuequivariance_ops_torch is not available")


@pytest.fixture(scope="module")
def ethanol_frames():
    with np.load(EMBEDDED_RMD17 / "npz_data" / "rmd17_ethanol.npz") as data:
        return data["nuclear_charges"], data["coords"][[0, 137]]


@pytest.fixture(
    scope="module", params=[False, pytest.param(True, marks=pytest.mark.slow)], ids=["full-cg", "reduced-cg"]
)
def pair(request):
    """(e3nn MACE, the same converted to cuEquivariance), for both Clebsch-Gordan bases."""
    model = small_mace(channels=8, use_reduced_cg=request.param)
    return model, to_cueq(model)


def _difference(a: dict, b: dict) -> float:
    return max(float((a[key] - b[key]).abs().max()) for key in ("energy", "forces"))


def transfer_adapters(adapted: torch.nn.Module, base: torch.nn.Module, converted: torch.nn.Module) -> None:
    """Give ELoRA on ``converted`` the values of ELoRA on the e3nn model ``adapted`` (``base`` before adapting)."""
    source, base_values = dict(adapted.named_parameters()), dict(base.named_parameters())
    pattern = re.compile(r"(products\.\d+\.symmetric_contractions)\.parametrizations\.weight\.0\.([ABD])\.(\d+)")
    with torch.no_grad():
        for name, parameter in converted.named_parameters():
            if not parameter.requires_grad:
                continue
            match = pattern.fullmatch(name)
            if match is None:  # Linear, tensor products, radial MLP: the same names
                parameter.copy_(source[name])
                continue
            prefix, kind, index = match.group(1), match.group(2), int(match.group(3))
            contractions = adapted.get_submodule(prefix).contractions
            highest = [k for k in range(len(contractions))]
            lower = [(k, j) for k in range(len(contractions)) for j in range(len(contractions[k].weights))]
            if kind in "AB":
                parameter.copy_(source[f"{prefix}.contractions.{highest[index]}.parametrizations.weights_max.0.{kind}"])
            else:
                k, j = lower[index]
                key = f"{prefix}.contractions.{k}.weights.{j}"
                parameter.copy_(source[key] - base_values[key])


def test_converted_model_equals_e3nn(pair, ethanol_frames):
    model, converted = pair
    z, positions = ethanol_frames
    assert any(isinstance(m, cuet.SymmetricContraction) for m in converted.modules())
    outputs = outputs_on(z, positions)
    assert _difference(outputs(model), outputs(converted)) <= 1e-10


def test_elora_on_converted_model_equals_elora_on_e3nn(pair, ethanol_frames):
    model, converted = pair
    z, positions = ethanol_frames
    outputs = outputs_on(z, positions)
    adapted = randomize_trainable(elora.apply(copy.deepcopy(model), rank=4, alpha=4.0), scale=0.3)
    adapted_cueq = elora.apply(copy.deepcopy(converted), rank=4, alpha=4.0)
    trainable = [p.numel() for p in adapted_cueq.parameters() if p.requires_grad]
    assert sum(trainable) == sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert _difference(outputs_on(z, positions)(adapted_cueq), outputs(converted)) == 0.0  # identity at start
    transfer_adapters(adapted, model, adapted_cueq)
    reference = outputs(adapted)
    assert _difference(reference, outputs(model)) > 1e-3, "the adapters must really change the model"
    # 1e-10 relative to the energy: the reduced basis projects the update through a float64 matrix (2.8e-10 eV
    # of 4176 eV measured); in the full basis the two agree to the last bit
    bound = 1e-10 * max(1.0, float(reference["energy"].abs().max()))
    assert _difference(reference, outputs(adapted_cueq)) <= bound
    assert_rotation_equivariant(energy_forces(adapted_cueq, z), torch.as_tensor(positions[1]), tol=1e-9)
    merged = assert_merge_equivalent(adapted_cueq, elora.ELoRA(), outputs, tol=1e-12)  # merged == unmerged
    assert _difference(reference, outputs(merged)) <= bound


def test_adapted_model_is_refused(pair):
    with pytest.raises(UserError, match="merge them first"):
        to_cueq(elora.apply(copy.deepcopy(pair[0]), rank=2, alpha=2.0))


_ENERGY_SCRIPT = """
import sys, json
for name in ("cuequivariance", "cuequivariance_torch"):  # as if cuequivariance were not installed
    sys.modules[name] = None
import numpy as np, torch, workbench
from mace.modules.wrapper_ops import CUET_AVAILABLE
from workbench.models.mace import load_mace
from workbench.domains.atomistic.frames import Frame, collate, predict, to_graphs
data = np.load(sys.argv[2])
model = load_mace()
graphs = to_graphs([Frame(data["nuclear_charges"], data["coords"][i]) for i in range(3)], [1, 6, 7, 8], 5.0)
energies, _ = predict(model, graphs)
print(json.dumps({"cuet": CUET_AVAILABLE, "energies": energies.tolist(),
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""


def test_shipped_checkpoint_loads_the_same_with_and_without_cuequivariance():
    """This process has cuequivariance; a second one hides it (as if it were not installed)."""
    from mace.modules.wrapper_ops import CUET_AVAILABLE
    from workbench.domains.atomistic.frames import Frame, predict, to_graphs

    npz = EMBEDDED_RMD17 / "npz_data" / "rmd17_ethanol.npz"
    done = subprocess.run(
        [sys.executable, "-c", _ENERGY_SCRIPT, "hidden", str(npz)], capture_output=True, text=True, cwd=ROOT, check=True
    )
    hidden = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(npz) as data:
        frames = [Frame(data["nuclear_charges"], data["coords"][i]) for i in range(3)]
    model = load_mace()
    energies, _ = predict(model, to_graphs(frames, [1, 6, 7, 8], 5.0))
    assert CUET_AVAILABLE and not hidden["cuet"]
    assert sum(p.numel() for p in model.parameters()) == hidden["parameters"]
    np.testing.assert_allclose(energies, hidden["energies"], rtol=0, atol=1e-12)
    stored = json.loads((ROOT / "models" / "checkpoints" / "mace_xtb_small.json").read_text())["hparams"]
    assert stored["use_reduced_cg"] is False
    assert load_mace().use_reduced_cg is False


def test_mace_lora_refuses_the_converted_model(pair):
    from workbench.adaptation.mace_lora import MaceLoRA
    from workbench.domains.atomistic.task import Rmd17

    with pytest.raises(UserError, match="--backend e3nn"):
        MaceLoRA().check(Rmd17(), None, pair[1])


@pytest.mark.slow
def test_adapt_on_the_cueq_backend_reloads_to_its_numbers(tiny_rmd17, tmp_path):
    from workbench.domains.atomistic.task import Rmd17

    import workbench

    run = workbench.adapt(
        domain="rmd17", method="elora", baselines=["readout"], data=str(tiny_rmd17), epochs=1, train_size=10,
        val_size=5, out=str(tmp_path / "run"), quiet=True, task_options={"backend": "cueq"},
        method_options={"rank": 4},
    )  # fmt: skip
    assert any(isinstance(m, cuet.SymmetricContraction) for m in run.model.modules())
    task = Rmd17(backend="cueq")
    raw = task.read(str(tiny_rmd17))
    rescored = task.evaluate(run.model, task.test_samples(run.model, raw), "cpu").metrics
    assert rescored == pytest.approx(run.metrics["after"], rel=1e-9)
