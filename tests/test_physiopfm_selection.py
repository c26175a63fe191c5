"""PhysioPFM's backprop-free selection (the bank entry or generated draw with the best forward-pass balanced accuracy
on the site's labelled beats), its averaged DDIM draws, its cache of fitted generators and its float16 bank file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("wfdb")
pytest.importorskip("neurokit2")

from workbench.adaptation import lora  # noqa: E402
from workbench.adaptation.physiopfm.bank import Bank, BankEntry, load_bank, save_bank  # noqa: E402

from workbench.core.registry import methods, tasks  # noqa: E402


def site(method: str, **options):
    task = tasks.get("physio")()
    task.progress = False
    model = task.load_model(None)
    data, _ = task.prepare(model, task.read(None, 0), 100_000, 100_000, 0)
    chosen = methods.get(method)(**options)
    chosen.progress = False
    return task, data, chosen.prepare(model), chosen


def labelled_scores(task, data, model, bank, vectors):
    """Balanced accuracy on the labelled (train + validation) beats of the model with each vector, by evaluate()."""
    labelled = list(data.train) + list(data.val)
    scores = []
    for vector in vectors:
        lora.set_adapter_weights(model, bank.factors_of(vector))
        scores.append(task.evaluate(model, labelled, None).metrics["balanced_accuracy"])
    return scores


def adapter_vector(model, bank):
    layers = lora.lora_layers(model)
    return torch.cat([t.flatten() for name in bank.layers
                      for t in (layers[name].lora_A.weight, layers[name].lora_B.weight)])  # fmt: skip


@pytest.mark.slow  # 16 bank entries scored twice on the labelled beats: ~25 s alone, minutes under load
def test_the_selection_baseline_keeps_the_bank_entry_best_on_the_labelled_beats():
    task, data, model, method = site("physiopfm-nearest", choose_by="labelled_accuracy", bank_sites="A", held_out=0.0)
    method.setup(task, model, data, 0)
    chosen = adapter_vector(model, method.bank).detach().clone()
    entries = method.used_entries()
    scores = labelled_scores(task, data, model, method.bank, [e.vector() for e in entries])
    best = int(np.argmax(scores))
    assert len(entries) == 16 and len(set(np.round(scores, 6))) > 1  # a real choice among different scores
    torch.testing.assert_close(chosen, entries[best].vector())
    numbers = method.diagnostics(task, model, data)
    assert numbers["selected_candidate"] == best and numbers["candidates"] == 16
    assert numbers["selected_labelled_balanced_accuracy"] == pytest.approx(scores[best])
    nearest = site("physiopfm-nearest", bank_sites="A")[3]  # the default still chooses by descriptor
    assert nearest.config["choose_by"] == "descriptor"


def test_generated_draws_are_averaged_or_the_best_draw_is_kept_and_a_cached_generator_gives_the_same_draws(tmp_path):
    options = {"bank_sites": "A", "iterations": 20, "sampling_steps": 4, "width": 16, "depth": 1,
               "generator_cache": str(tmp_path / "cache")}  # fmt: skip
    task, data, model, method = site("physiopfm", draws=3, **options)
    method.setup(task, model, data, 5)
    assert "generator_loaded_from_cache" not in method.diagnostics_
    descriptor = torch.as_tensor(method.site["descriptor"])[None]
    draws = [method.generator.generate(descriptor, sampling_steps=4, seed=5000 + k)[0] for k in range(3)]
    torch.testing.assert_close(adapter_vector(model, method.bank), torch.stack(draws).mean(0))
    assert not torch.allclose(draws[0], draws[1])  # different seeds: different draws

    task, data, model, chooser = site("physiopfm", draws=3, draw_choice="select", **options)
    chooser.setup(task, model, data, 5)
    kept = adapter_vector(model, chooser.bank).detach().clone()
    assert chooser.diagnostics_["generator_loaded_from_cache"] == 1.0
    scores = labelled_scores(task, data, model, chooser.bank, draws)
    assert chooser.diagnostics_["selected_candidate"] == int(np.argmax(scores))
    torch.testing.assert_close(kept, draws[int(np.argmax(scores))])
    # candidates of clearly different quality: no LoRA and three bank entries
    candidates = torch.stack([torch.zeros_like(draws[0])] + [e.vector() for e in chooser.bank.entries[:3]])
    scores = labelled_scores(task, data, model, chooser.bank, candidates)
    assert len(set(np.round(scores, 6))) > 1
    assert chooser.best_on_labelled(task, model, data, candidates) == int(np.argmax(scores))


def test_a_float16_bank_reads_back_as_float32_within_half_precision(tmp_path):
    factors = {"blocks.0.attn.qkv": (torch.randn(4, 8) * 0.1, torch.randn(24, 4) * 0.01)}
    entry = BankEntry(factors, np.ones((2, 5), np.float32), np.array([3, 1]), {"name": "x", "site": "S"})
    bank = Bank([entry], {"n_classes": 2}, "mem", list(factors))
    save_bank(bank, tmp_path / "half.safetensors", dtype=torch.float16)
    save_bank(bank, tmp_path / "full.safetensors")
    back = load_bank(tmp_path / "half.safetensors").entries[0].vector()
    assert back.dtype == torch.float32
    torch.testing.assert_close(back, entry.vector(), rtol=1e-3, atol=1e-5)
    saved = (tmp_path / "full.safetensors").stat().st_size - (tmp_path / "half.safetensors").stat().st_size
    assert saved >= 2 * (4 * 8 + 24 * 4) - 16  # two bytes less per factor value (headers may differ by a few)
