"""The module paths before the engine's floors (0.1) keep working until 0.3, each with a FutureWarning naming the
new path: a plug-in written against ``workbench.task`` or a notebook calling ``workbench.run.adapt`` still runs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from workbench._moved import MOVED


def test_every_old_module_path_is_the_new_module_with_a_warning():
    code = ("import importlib, warnings\nfrom workbench._moved import MOVED\nfor old, new in sorted(MOVED.items()):\n"
            "    with warnings.catch_warnings(record=True) as caught:\n        warnings.simplefilter('always')\n"
            "        module = importlib.import_module(old)\n    assert module is importlib.import_module(new), old\n"
            "    said = [str(w.message) for w in caught if w.category is FutureWarning]\n"
            "    assert said and said[0].startswith(f'{old} moved to {new} in workbench 0.2'), (old, said)\n"
            "print(len(MOVED))")  # fmt: skip (a fresh process: no old path imported before)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == len(MOVED) >= 30


def test_from_workbench_import_an_old_module_gives_the_new_one():
    with pytest.warns(FutureWarning, match="workbench.statistics moved to workbench.comparison.statistics"):
        exec("from workbench import statistics as old", namespace := {})
    assert namespace["old"] is importlib.import_module("workbench.comparison.statistics")


@pytest.mark.parametrize(("package", "name", "home"), [
    ("workbench.run", "run_request", "workbench.run.adapting"),
    ("workbench.run", "evaluate_run", "workbench.run.evaluating"),
    ("workbench.comparison", "plan_cells", "workbench.comparison.design"),
    ("workbench.comparison", "run_cell", "workbench.comparison.cells"),
])  # fmt: skip
def test_a_name_of_a_former_module_is_forwarded_with_a_warning(package, name, home):
    with pytest.warns(FutureWarning, match=f"{package}.{name} moved to {home}.{name}"):
        found = getattr(importlib.import_module(package), name)
    assert found is getattr(importlib.import_module(home), name)


@pytest.mark.parametrize(("package", "name"), [("workbench.run", "adapt"), ("workbench.run", "Run"),
                                               ("workbench.run", "predict"), ("workbench.comparison", "compare"),
                                               ("workbench.comparison", "CompareSpec")])  # fmt: skip
def test_the_packages_public_names_need_no_warning(package, name, recwarn):
    assert getattr(importlib.import_module(package), name) is getattr(importlib.import_module("workbench"), name)
    assert not [w for w in recwarn if w.category is FutureWarning]


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        importlib.import_module("workbench.run").nothing_here
