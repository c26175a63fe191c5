"""Shared fixtures: a small random MACE model and real molecules (the embedded DFT frames)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import workbench  # noqa: F401  (sets torch's safe globals before e3nn is imported)

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED_RMD17 = ROOT / "domains" / "atomistic" / "embedded" / "rmd17"


def small_mace(seed: int = 0, channels: int = 16, **replace):
    """A random MACE of the foundation's architecture with fewer channels (fast tests); ``replace`` swaps
    hyper-parameters (``use_reduced_cg=True``)."""
    from workbench.models.mace import FOUNDATION_ARCHITECTURE, build_mace  # mace-torch: not in SevenNet's environment

    torch.manual_seed(seed)
    hparams = dict(
        FOUNDATION_ARCHITECTURE,
        hidden_irreps=f"{channels}x0e + {channels}x1o",
        atomic_energies=[-13.6, -1029.0, -1485.0, -2042.0],
        avg_num_neighbors=8.0,
        atomic_inter_scale=1.0,
        atomic_inter_shift=0.0,
        **replace,
    )
    return build_mace(hparams)


def pytest_configure(config):
    """Seals are signed with a key of this session's own (`workbench.core.sealkeys`): ``XDG_CONFIG_HOME`` and
    ``WORKBENCH_SEAL_KEY`` point into a temporary folder before any test module is imported (modules copy
    ``os.environ`` for their subprocesses), so the suite never reads or writes the user's key or trusted keys."""
    folder = Path(tempfile.mkdtemp(prefix="workbench-test-config-"))
    config.workbench_saved_env = {name: os.environ.get(name) for name in ("XDG_CONFIG_HOME", "WORKBENCH_SEAL_KEY")}
    config.workbench_config = folder
    os.environ["XDG_CONFIG_HOME"] = str(folder)
    os.environ["WORKBENCH_SEAL_KEY"] = str(folder / "workbench" / "seal-key.pem")


@pytest.fixture(scope="session", autouse=True)
def seal_key_of_the_session(pytestconfig):
    """The session's configuration folder (`pytest_configure`), checked in place for every test and removed, with the
    environment given back, at the end."""
    folder = pytestconfig.workbench_config
    assert os.environ["WORKBENCH_SEAL_KEY"].startswith(str(folder))
    yield folder
    for name, value in pytestconfig.workbench_saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def mace_model():
    return small_mace()


@pytest.fixture(scope="session")
def ethanol():
    """(atomic numbers (9,), positions (n_frames, 9, 3) [Å]) of the embedded ethanol frames."""
    with np.load(EMBEDDED_RMD17 / "npz_data" / "rmd17_ethanol.npz") as data:
        return data["nuclear_charges"], data["coords"]


def energy_forces(model, atomic_numbers):
    """``positions (n, 3) [Å] -> (energy () [eV], forces (n, 3) [eV/Å])`` of ``model``, for property checks."""
    from workbench.domains.atomistic.frames import Frame, collate, to_graphs

    from workbench.core.device import device_of

    def compute(positions: torch.Tensor):
        graphs = to_graphs(
            [Frame(np.asarray(atomic_numbers), positions.detach().numpy())],
            [int(z) for z in model.atomic_numbers],
            float(model.r_max),
        )
        out = model(collate(graphs, device_of(model)).to_dict(), training=False, compute_force=True)
        return out["energy"][0].detach(), out["forces"].detach()

    return compute


def outputs_on(atomic_numbers, positions):
    """``model -> {"energy", "forces"}`` on a few frames (the ``outputs`` of workbench.core.testing checks)."""

    def outputs(model):
        energies, forces = zip(*(energy_forces(model, atomic_numbers)(torch.as_tensor(p)) for p in positions))
        return {"energy": torch.stack(energies), "forces": torch.stack(forces)}

    return outputs


def randomize_trainable(model, scale: float = 0.1, seed: int = 1):
    """Give every trainable tensor random non-zero values (adapters then really change the model)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale)
    return model


def write_rmd17_layout(root: Path, molecule: str = "ethanol", n_frames: int = 60, n_train: int = 40, **replace) -> Path:
    """A small rMD17-layout folder cut from the embedded DFT frames; ``replace`` swaps npz fields."""
    with np.load(EMBEDDED_RMD17 / "npz_data" / "rmd17_ethanol.npz") as data:
        arrays = {
            key: data[key][:n_frames] if data[key].ndim and key != "nuclear_charges" else data[key]
            for key in data.files
        }
    arrays.update(replace)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    (root / "npz_data").mkdir(parents=True, exist_ok=True)
    (root / "splits").mkdir(exist_ok=True)
    np.savez(root / "npz_data" / f"rmd17_{molecule}.npz", **arrays)
    np.savetxt(root / "splits" / "index_train_01.csv", np.arange(n_train), fmt="%d")
    np.savetxt(root / "splits" / "index_test_01.csv", np.arange(n_train, n_frames), fmt="%d")
    return root


@pytest.fixture
def tiny_rmd17(tmp_path):
    """60 embedded ethanol frames in rMD17's layout: 40 in the training split, 20 in the test split."""
    return write_rmd17_layout(tmp_path / "rmd17")


def cli(*args: str) -> subprocess.CompletedProcess:
    """``workbench ARGS`` run in this process (`workbench.cli.main`, which turns a user error into one line on stderr
    and exit code 2): the same code path as the console script without a new interpreter's imports, for the cases
    that stop before training. A traceback would propagate here and fail the test."""
    from workbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    logs = logging.StreamHandler(err)  # the log lines a console run prints on stderr (skipped records, say)
    logging.getLogger().addHandler(logs)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
            main(list(args))
    finally:
        logging.getLogger().removeHandler(logs)
    return subprocess.CompletedProcess(["workbench", *args], exit_.value.code, out.getvalue(), err.getvalue())


def one_line_error(result: subprocess.CompletedProcess, *names: str) -> str:
    """The one ``workbench: error:`` line of a command that exited 2 without a traceback; it names ``names``."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("workbench: error:")]
    assert len(errors) == 1, result.stderr
    for name in names:
        assert name in errors[0], errors[0]
    return errors[0]
