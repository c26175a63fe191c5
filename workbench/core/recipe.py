"""A method's authors' recipe: the run settings, task options and method options they trained with, by name.

A method declares its recipes (`workbench.core.method.Method.recipes`, name -> `Recipe`); a run asks for one with
``--recipe METHOD:NAME`` (``--recipe NAME``: the run's chosen method's). The recipe fills every run setting the
user left at its declared default, the task options of its task and, for the method that declares it, the method
options; what the user gave instead stays, and the report lists it as a deviation (`deviations`). Every method of
the run trains under the recipe's settings: the paper's baselines ran under the same recipe as its method.
``config.yaml`` records the recipe by its full name; each cell of a comparison records it in its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from workbench.core.errors import UserError


@dataclass(frozen=True)
class Recipe:
    """One named training recipe of a method, as its authors ran it."""

    #: Where it was read: the paper, the released code (repository, branch, file).
    source: str
    #: Run settings by `workbench.core.settings.Setting.name` (``learning_rate``, ``batch_size``, ``epochs``, ...).
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: Task name -> its options; a recipe is for these tasks only.
    task_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Options of the method that declares the recipe.
    method_options: Mapping[str, Any] = field(default_factory=dict)
    #: What the recipe could not reproduce here, in a sentence each (shown in the report).
    departures: tuple[str, ...] = ()


def find(name: str, chosen_method: Any, registry: Any) -> tuple[str, str, Recipe]:
    """``(method, recipe name, recipe)`` of ``--recipe name`` (``METHOD:NAME``, or ``NAME`` of ``chosen_method``'s
    class); a `UserError` naming the recipes there are when there is no such recipe."""
    owner_name, _, recipe_name = name.rpartition(":")
    owner = registry.get(owner_name) if owner_name else chosen_method
    recipes = getattr(owner, "recipes", {})
    if recipe_name not in recipes:
        known = ", ".join(f"{owner.name}:{known}" for known in recipes) or "none"
        raise UserError(f"--recipe {name}: method '{owner.name}' has no recipe '{recipe_name}' (its recipes: {known})")
    return owner.name, recipe_name, recipes[recipe_name]


def apply(request: Any, task: str, method: str, defaults: Mapping[str, Any], registry: Any) -> Any:
    """``request`` (a `workbench.core.config.RunRequest`) with the recipe it names filled in: every setting the user
    left at its declared default (``defaults``: name -> default) takes the recipe's value; task and method options
    the user gave win over the recipe's. ``request.recipe`` becomes the full name ``METHOD:NAME``; ``registry``:
    the methods' (`workbench.core.registry.methods`)."""
    owner, recipe_name, recipe = find(request.recipe, registry.get(method), registry)
    if recipe.task_options and task not in recipe.task_options:
        raise UserError(f"--recipe {owner}:{recipe_name} is for task(s) {', '.join(recipe.task_options)}, not "
                        f"'{task}'")  # fmt: skip
    unknown = sorted(set(recipe.settings) - set(defaults))
    if unknown:
        raise UserError(f"recipe {owner}:{recipe_name} sets unknown run settings: {', '.join(unknown)}")
    filled = {name: value for name, value in recipe.settings.items() if getattr(request, name) == defaults[name]}
    task_options = {**recipe.task_options.get(task, {}), **dict(request.task_options)}
    method_options = dict(request.method_options)
    if owner == method:
        method_options = {**recipe.method_options, **method_options}
    return dataclasses.replace(request, **filled, task_options=task_options, method_options=method_options,
                               recipe=f"{owner}:{recipe_name}")  # fmt: skip


def deviations(config: Any, registry: Any) -> list[str]:
    """What a resolved `workbench.core.config.RunConfig` runs differently from the recipe it names, one
    ``"name: recipe's → this run's"`` each (settings, then the task's and the method's options); the recipe's own
    `Recipe.departures` follow. Empty without a recipe."""
    if not config.recipe:
        return []
    owner, recipe_name = config.recipe.rsplit(":", 1)
    recipe = registry.get(owner).recipes[recipe_name]
    found = [f"{name}: {value!r} → {getattr(config, name)!r}" for name, value in recipe.settings.items()
             if getattr(config, name) != value]  # fmt: skip
    options = [(recipe.task_options.get(config.task, {}), config.task_options)]
    if config.method == owner:
        options.append((recipe.method_options, config.method_options))
    for wanted, given in options:
        found += [f"{name}: {value!r} → {given.get(name)!r}" for name, value in wanted.items()
                  if given.get(name) != value]  # fmt: skip
    return found + list(recipe.departures)
