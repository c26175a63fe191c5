"""PhysioPFM's parts against closed forms (the simplex ETF, perceptually important points), its bank file, and
the method on the physio task: the site's adaptation runs no backward pass, and the bad inputs of issue 12 are
refused before a run directory appears."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")

from workbench.adaptation import lora  # noqa: E402
from workbench.adaptation.physiopfm.bank import (  # noqa: E402
    Bank,
    BankEntry,
    attach,
    load_bank,
    save_bank,
)
from workbench.adaptation.physiopfm.descriptors import (  # noqa: E402
    class_prototypes,
    perceptually_important_points,
    pip_shapelet,
    task_descriptor,
)
from workbench.adaptation.physiopfm.etf import EtfHead, simplex_etf  # noqa: E402
from workbench.domains.physio.bank import SHIPPED_BANK  # noqa: E402

import workbench  # noqa: E402
from workbench.core.errors import UserError  # noqa: E402
from workbench.core.registry import methods, tasks  # noqa: E402

FAST = {"epochs": 2, "train_size": 64, "val_size": 32, "batch_size": 16, "quiet": True}


# -- the ETF head and the descriptors: closed forms -----------------------------------------------------------------
@pytest.mark.parametrize("classes, width", [(2, 2), (4, 64), (5, 16)])
def test_the_simplex_etf_has_unit_anchors_at_cosine_minus_one_over_k_minus_one(classes, width):
    frame = simplex_etf(classes, width, seed=3).double()
    gram = frame.T @ frame
    expected = torch.full((classes, classes), -1.0 / (classes - 1), dtype=torch.float64).fill_diagonal_(1.0)
    torch.testing.assert_close(gram, expected, atol=1e-6, rtol=0)
    assert torch.allclose(frame.sum(1), torch.zeros(width, dtype=torch.float64), atol=1e-6)  # centred simplex


def test_the_etf_head_is_fixed_and_gives_temperature_times_cosine():
    head = EtfHead(8, 3, temperature=5.0)
    assert not list(head.parameters())
    z = torch.randn(4, 8)
    cosine = torch.nn.functional.cosine_similarity(z[:, :, None], head.frame[None], dim=1)
    torch.testing.assert_close(head(z), 5.0 * cosine)
    with pytest.raises(UserError, match="classes"):
        simplex_etf(5, 4)


def test_pips_find_the_corners_of_a_piecewise_linear_series_and_the_shapelet_redraws_it():
    corners_t = np.array([0, 20, 45, 60, 99])
    corners_y = np.array([0.0, 3.0, -2.0, 1.0, 0.5])
    t = np.arange(100)
    y = np.interp(t, corners_t, corners_y)
    np.testing.assert_array_equal(perceptually_important_points(y, 5), corners_t)
    shapelet = pip_shapelet(y, 5, 100)
    np.testing.assert_allclose(shapelet, y, atol=1e-6)
    with pytest.raises(UserError, match="shorter than the shapelet length 32"):
        pip_shapelet(y[:20], 5, 32)


def test_a_descriptor_marks_absent_classes_with_zeros_and_shares_sum_to_one():
    rng = np.random.default_rng(0)
    series, labels = rng.normal(size=(30, 50)), np.array([0] * 20 + [2] * 10)
    prototypes, counts = class_prototypes(series, labels, 3)
    np.testing.assert_allclose(prototypes[2], np.median(series[20:], axis=0), rtol=1e-6)
    assert counts.tolist() == [20, 0, 10]
    d = task_descriptor(prototypes, counts, "shapelet", n_points=6, length=16).reshape(3, 18)
    assert d[:, 0].tolist() == [1, 0, 1] and np.isclose(d[:, 1].sum(), 1) and not d[1].any()
    assert task_descriptor(prototypes, counts, "raw").shape == (3 * 52,)


# -- the bank ---------------------------------------------------------------------------------------------------------
def test_the_shipped_bank_reads_back_with_provenance_and_fitted_for_the_shipped_backbone():
    bank = load_bank(SHIPPED_BANK)
    assert bank.sites() == ["A", "B", "C", "D"] and len(bank.entries) >= 40
    record = bank.entries[0].provenance
    assert {"site", "classes", "subjects", "seed", "series_sha256", "record_sha256"} <= set(record)
    vector = bank.entries[0].vector()
    for name, (a, b) in bank.factors_of(vector).items():
        torch.testing.assert_close(a, bank.entries[0].factors[name][0])
        torch.testing.assert_close(b, bank.entries[0].factors[name][1])
    assert np.mean([e.provenance["fit_balanced_accuracy"] for e in bank.entries]) > 0.8


def test_a_bank_round_trips_and_a_file_that_is_not_one_is_refused(tmp_path):
    factors = {"blocks.0.attn.qkv": (torch.randn(4, 8), torch.randn(24, 4))}
    entry = BankEntry(factors, np.ones((2, 5), np.float32), np.array([3, 1]), {"name": "x", "site": "S"})
    save_bank(Bank([entry], {"n_classes": 2}, "mem", list(factors)), tmp_path / "bank.safetensors")
    back = load_bank(tmp_path / "bank.safetensors")
    torch.testing.assert_close(back.entries[0].vector(), entry.vector())
    assert back.entries[0].provenance == {"name": "x", "site": "S"} and back.settings == {"n_classes": 2}
    from workbench.core.checkpoint import save_tensors

    save_tensors(tmp_path / "other.safetensors", {"w": torch.zeros(2)})
    with pytest.raises(UserError, match="not a PhysioPFM bank"):
        load_bank(tmp_path / "other.safetensors")


def test_attach_refuses_a_head_of_another_class_count_and_starts_at_the_frozen_backbone():
    family = workbench.core.registry.models.get("patch-gpt")()
    with pytest.raises(UserError, match="the bank's head has 4 classes.*has 3"):
        attach(family.load(None, n_times=175, n_outputs=3, sfreq=250.0), 4)
    model = family.load(None, n_times=175, n_outputs=4, sfreq=250.0).eval()
    x = torch.randn(2, 175)
    features = model.features(x).detach()
    attached = attach(model, 4).eval()  # in place
    assert not any(p.requires_grad for p in attached.parameters()) and len(lora.lora_layers(attached)) == 6
    torch.testing.assert_close(attached.features(x), features)  # B = 0: the frozen backbone's features
    torch.testing.assert_close(attached(x), attached.head(features))


# -- the method on the physio task ------------------------------------------------------------------------------------
def site_setup(**options):
    task = tasks.get("physio")()
    task.progress = False
    raw = task.read(None, 0)
    model = task.load_model(None)
    data, _ = task.prepare(model, raw, 100_000, 100_000, 0)
    method = methods.get("physiopfm")(**{"iterations": 30, "sampling_steps": 5, **options})
    method.progress = False
    return task, data, model, method


def test_the_site_adaptation_runs_no_backward_pass(monkeypatch):
    task, data, model, method = site_setup()
    method.check(task, data, model)
    model = method.prepare(model)
    calls = []
    adapt_site = method.adapt_site

    def guarded(*args, **kwargs):  # during the site's stage (d), any backward pass is recorded
        with monkeypatch.context() as patch:
            patch.setattr(torch.autograd, "backward", lambda *a, **k: calls.append("backward"))
            patch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append("grad"))
            patch.setattr(torch.Tensor, "backward", lambda *a, **k: calls.append("Tensor.backward"))
            assert not torch.is_grad_enabled()
            return adapt_site(*args, **kwargs)

    method.adapt_site = guarded
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    method.setup(task, model, data, 0)
    assert calls == []
    assert all(p.grad is None for p in model.parameters())
    after = dict(model.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)  # only the adapters changed
    assert any(layer.lora_B.weight.abs().sum() > 0 for layer in lora.lora_layers(model).values())
    numbers = method.diagnostics(task, model, data)
    assert numbers["site_adaptation_seconds"] > 0 and -1 <= numbers["delta_cosine_held_out"] <= 1


def test_a_bank_holding_the_target_site_is_refused():
    task, data, model, method = site_setup(bank_sites="C,D")
    with pytest.raises(UserError, match="the bank contains the target site.*site D"):
        method.check(task, data, model)


def test_a_bank_of_another_backbone_is_refused():
    task, data, _, method = site_setup()
    fresh = task.load_model(None)
    with torch.no_grad():
        fresh.blocks[0].attn.qkv.weight.add_(1.0)
    with pytest.raises(UserError, match="'backbone'"):
        method.check(task, data, fresh)


def test_non_finite_generated_weights_are_refused(monkeypatch):
    task, data, model, method = site_setup(generator="regressor")
    model = method.prepare(model)
    monkeypatch.setattr(type(method), "choose_factors", lambda self, d, s: torch.full((6144,), float("nan")))
    with pytest.raises(UserError, match="not finite; not merged"):
        method.setup(task, model, data, 0)
    assert all(layer.lora_B.weight.abs().sum() == 0 for layer in lora.lora_layers(model).values())


def test_a_physiopfm_run_writes_every_stage_and_its_baselines(tmp_path):
    out = tmp_path / "run"
    baselines = ["physiopfm-none", "physiopfm-mean", "physiopfm-nearest", "physiopfm-local"]
    run = workbench.adapt("physio", "physiopfm", out=str(out), baselines=baselines, **FAST,
                          method_options={"iterations": 200, "sampling_steps": 10})  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["baselines"]) == set(baselines)
    assert metrics["costs"]["physiopfm"]["epochs"] == 0 and metrics["costs"]["physiopfm-local"]["epochs"] >= 1
    assert metrics["after"]["bank_entries"] > 10 and metrics["after"]["site_adaptation_seconds"] > 0
    for name in ("bank.json", "site_descriptor.safetensors", "generator.safetensors"):
        assert (out / "physiopfm" / name).is_file(), name
    used = json.loads((out / "physiopfm" / "bank.json").read_text())
    assert {e["site"] for e in used["entries"]} == {"A", "B", "C"}  # the target site D left out
    beats = torch.randn(3, 175)
    assert run.model(beats).shape == (3, 4)


def test_series_shorter_than_the_shapelet_stop_the_run_before_its_directory(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(UserError, match="shorter than the shapelet length 400"):
        workbench.adapt("physio", "physiopfm", out=str(out), baselines=[], **FAST,
                        method_options={"shapelet_length": 400})  # fmt: skip
    assert not out.exists()


def test_pretrain_stage_is_refused_by_a_task_with_one_stage_and_an_unknown_stage(tmp_path):
    from conftest import cli

    for domain, stage, message in (("csbm", "bank", "pretrains in one stage"), ("physio", "heads", "'backbone'")):
        done = cli("pretrain", "--domain", domain, "--stage", stage, "--out", str(tmp_path / "x.safetensors"))
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_pretrain_stage_bank_writes_a_bank_with_provenance(tmp_path):
    from workbench.domains.physio.bank import build_physio_bank

    bank = build_physio_bank(tmp_path / "bank.safetensors", sites=("B",), steps=2, progress=False)
    back = load_bank(tmp_path / "bank.safetensors")
    assert len(back.entries) == len(bank.entries) == 12 and back.sites() == ["B"]
    assert all(len(e.provenance["record_sha256"]) == 2 for e in back.entries)


def test_the_bank_baselines_choose_from_the_entries_the_generator_is_fitted_on():
    """Issue 25's audit: the generator was fitted on 49 entries while the mean and nearest baselines used all 54."""
    task, data, model, method = site_setup(generator="regressor")
    method.setup(task, method.prepare(model), data, 7)
    mean = methods.get("physiopfm-mean")()
    mean.progress = False
    mean_model = mean.prepare(task.load_model(None))
    mean.setup(task, mean_model, data, 7)
    fitted = [e for e in mean.bank.entries if e.provenance["name"] in set(method.fitted_on)]
    assert 0 < len(fitted) == len(method.fitted_on) < len(mean.bank.entries)
    assert mean.diagnostics(task, mean_model, data)["bank_entries"] == len(fitted)
    layers = lora.lora_layers(mean_model)
    for name, (a, b) in mean.bank.factors_of(torch.stack([e.vector() for e in fitted]).mean(0)).items():
        torch.testing.assert_close(layers[name].lora_A.weight.detach(), a)  # summed in another order: not bitwise
        torch.testing.assert_close(layers[name].lora_B.weight.detach(), b)
    with pytest.raises(UserError, match="--held-out must be in"):
        methods.get("physiopfm-nearest")(held_out=1.0).bank_split(54, 0)
