"""A missing optional library is named one way everywhere: the pip command that installs this distribution's extra."""

from __future__ import annotations

import pytest

from workbench.core.errors import UserError
from workbench.core.registry import Registry, extra_of, install_command, missing_distribution
from workbench.core.task import Task


def test_a_task_whose_library_is_missing_names_the_install_command():
    class NeedsAbsent(Task):
        name = "needs-absent"
        requires = ("no_such_module_for_the_workbench",)
        extra = "eeg"

    with pytest.raises(UserError) as refused:
        NeedsAbsent()
    assert str(refused.value).endswith('which is not installed: pip install "sciadapt-workbench[eeg]"')


def test_a_plugin_that_cannot_be_loaded_names_the_extra_that_installs_its_library():
    registry = Registry("method", "workbench.no-such-group")
    registry._discovered = True
    registry.unavailable["eeg-thing"] = "ModuleNotFoundError: No module named 'mne'"
    with pytest.raises(UserError, match=r'install it: pip install "sciadapt-workbench\[eeg\]"'):
        registry.get("eeg-thing")
    assert install_command("medvl") == 'pip install "sciadapt-workbench[medvl]"'


def test_a_missing_import_name_is_said_by_its_pip_name_with_the_extra_of_the_plugin_that_needs_it():
    error = "ModuleNotFoundError: No module named 'sklearn'"
    assert missing_distribution(error) == "scikit-learn"  # what pip installs, not the import name
    assert missing_distribution("ValueError: bad value") is None
    assert extra_of(error, "workbench.domains.eeg.task") == "eeg"  # several extras install it: the plug-in's own
    assert extra_of(error, "workbench.adaptation.dre_baselines") == "shift"  # none named: the first that does
