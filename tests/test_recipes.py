"""A method's authors' recipe (`workbench.core.recipe`): it fills the settings a user left at their defaults, the
user's own choices stay and are listed as deviations, it is refused where it does not apply; ELoRA's ``paper``
recipe as read from the authors' code; the total-energy loss and the stored contraction factor it needs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workbench.core.config import RunRequest, resolve_config
from workbench.core.errors import UserError
from workbench.core.recipe import Recipe, apply, deviations
from workbench.core.settings import SETTINGS

DEFAULTS = {s.name: s.default for s in SETTINGS if s.factory is None}


class Owner:
    name = "owner"
    recipes = {"paper": Recipe(source="a paper", settings={"learning_rate": 5e-3, "batch_size": 7, "ema_decay": 0.995},
                               task_options={"toy": {"weight": 3.0}}, method_options={"rank": 4},
                               departures=("no weight decay",))}  # fmt: skip


class Other:
    name = "other"
    recipes: dict = {}


class Registry:
    def get(self, name):
        return {"owner": Owner, "other": Other}[name]


def test_a_recipe_fills_what_the_user_left_and_keeps_what_the_user_gave():
    request = RunRequest(domain="toy", recipe="paper", batch_size=3, task_options={"extra": 1})
    filled = apply(request, "toy", "owner", DEFAULTS, Registry())
    assert (filled.learning_rate, filled.batch_size, filled.ema_decay) == (5e-3, 3, 0.995)
    assert filled.task_options == {"weight": 3.0, "extra": 1} and filled.method_options == {"rank": 4}
    assert filled.recipe == "owner:paper"


def test_a_recipe_named_by_its_method_sets_another_methods_settings_but_not_its_options():
    filled = apply(RunRequest(domain="toy", recipe="owner:paper"), "toy", "other", DEFAULTS, Registry())
    assert filled.learning_rate == 5e-3 and filled.method_options == {}  # the paper's baseline, same recipe


@pytest.mark.parametrize(("name", "task", "method", "said"), [
    ("paper", "toy", "other", "method 'other' has no recipe 'paper' (its recipes: none)"),
    ("owner:nope", "toy", "owner", "method 'owner' has no recipe 'nope' (its recipes: owner:paper)"),
    ("paper", "elsewhere", "owner", "is for task(s) toy, not 'elsewhere'"),
])  # fmt: skip
def test_a_recipe_that_does_not_apply_is_refused(name, task, method, said):
    with pytest.raises(UserError, match=said.replace("(", r"\(").replace(")", r"\)")):
        apply(RunRequest(domain=task, recipe=name), task, method, DEFAULTS, Registry())


def test_deviations_list_each_setting_and_option_the_run_changed_then_the_recipes_departures():
    config = dataclasses.make_dataclass("C", ["recipe", "task", "method", "learning_rate", "batch_size", "ema_decay",
                                              "task_options", "method_options"])  # fmt: skip
    run = config("owner:paper", "toy", "owner", 5e-3, 3, 0.995, {"weight": 1.0}, {"rank": 4})
    assert deviations(run, Registry()) == ["batch_size: 7 → 3", "weight: 3.0 → 1.0", "no weight decay"]
    assert deviations(config(None, "toy", "owner", 1, 1, 1, {}, {}), Registry()) == []


def test_elora_paper_recipe_resolves_to_the_authors_settings():
    config, _ = resolve_config(RunRequest(domain="rmd17", recipe="paper", out="x"))
    assert config.recipe == "elora:paper" and config.method == "elora"
    assert (config.learning_rate, config.batch_size, config.ema_decay, config.clip_grad_norm) == (5e-3, 5, 0.995, 100)
    assert (config.lr_factor, config.lr_patience, config.precision, config.epochs) == (0.8, 5, "float64", 500)
    assert config.task_options["energy_loss"] == "total" and config.task_options["forces_weight"] == 1000
    assert config.method_options["contraction_a"] == "stored"
    settings = config.train_settings(config.learning_rate)
    assert (settings.clip_grad_norm, settings.lr_factor, settings.ema_decay) == (100.0, 0.8, 0.995)


def test_clip_zero_turns_clipping_off():
    config, _ = resolve_config(RunRequest(domain="features", clip_grad_norm=0.0, out="x"))
    assert config.train_settings(1e-3).clip_grad_norm is None


def test_the_total_energy_loss_is_the_total_energys_squared_error():
    from workbench.domains.atomistic.task import energy_forces_loss

    class Batch(dict):
        ptr = torch.tensor([0, 3, 8])
        weight = torch.ones(2, dtype=torch.float64)
        energy_weight = torch.ones(2, dtype=torch.float64)
        forces_weight = torch.ones(2, dtype=torch.float64)

    ref = Batch(energy=torch.tensor([1.0, 2.0], dtype=torch.float64), forces=torch.zeros(8, 3, dtype=torch.float64))
    pred = {"energy": torch.tensor([1.5, 1.0], dtype=torch.float64), "forces": torch.ones(8, 3, dtype=torch.float64)}
    total = energy_forces_loss(ref, pred, 1.0, 1000.0, "total")
    per_atom = energy_forces_loss(ref, pred, 1.0, 1000.0)
    assert total.item() == pytest.approx((0.5**2 + 1.0**2) / 2 + 1000.0)
    assert per_atom.item() == pytest.approx(((0.5 / 3) ** 2 + (1.0 / 5) ** 2) / 2 + 1000.0)


def test_the_stored_contraction_factor_starts_at_the_same_update_and_holds_its_division():
    from workbench.adaptation.elora import ElementLowRank
    from workbench.adaptation.lora.config import AdapterConfig

    config = AdapterConfig(4, 4.0)
    torch.manual_seed(0)
    divided = ElementLowRank((3, 5, 6), config, torch.float64, torch.device("cpu"))
    torch.manual_seed(0)
    stored = ElementLowRank((3, 5, 6), config, torch.float64, torch.device("cpu"), contraction_a="stored")
    torch.testing.assert_close(stored.A, divided.A / 5, rtol=0, atol=0)
    with torch.no_grad():
        divided.B.normal_()
        stored.B.copy_(divided.B)
    weight = torch.randn(3, 5, 6, dtype=torch.float64)
    torch.testing.assert_close(stored(weight), divided(weight), rtol=1e-14, atol=1e-14)  # the same update


def test_learning_curves_change_nothing_and_the_kept_epochs_point_is_the_result(tmp_path):
    import workbench

    common = dict(domain="features", baselines=["full"], epochs=3, quiet=True, threads=1)
    plain = workbench.adapt(out=str(tmp_path / "plain"), **common)
    tracked = workbench.adapt(out=str(tmp_path / "tracked"), curves=("accuracy",), **common)
    assert tracked.metrics["after"] == plain.metrics["after"]
    assert tracked.metrics["baselines"] == plain.metrics["baselines"]
    import json

    result = json.loads((tmp_path / "tracked" / "results" / "full.json").read_text())
    points = [entry["curves"] for entry in result["history"]]
    assert len(points) == result["epochs"] and set(points[0]) == {"val", "test"}
    assert points[result["best_epoch"]]["test"]["accuracy"] == result["metrics"]["accuracy"]


def test_curves_of_an_unknown_metric_are_refused():
    with pytest.raises(UserError, match="--curves nope: not a metric of task 'features'"):
        resolve_config(RunRequest(domain="features", curves=("nope",), out="x"))


def test_no_plugin_option_takes_a_run_settings_flag():
    """A task's or method's option named like a run setting's flag would break the command line (argparse refuses
    two arguments of one name): ``--clip`` is the importance-weighting methods', the run's is ``--clip-grad``."""
    from workbench.core.registry import methods, tasks

    flags = {setting.flag for setting in SETTINGS if setting.commands}
    clashes = [f"{registry.kind} {name}: --{option.name.replace('_', '-')}"
               for registry in (tasks, methods) for name in registry.names()
               for option in registry.get(name).options if f"--{option.name.replace('_', '-')}" in flags]  # fmt: skip
    assert not clashes, clashes
