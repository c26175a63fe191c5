"""A missing optional library is named one way everywhere: the pip command that installs this distribution's extra."""

from __future__ import annotations

import pytest

from workbench.errors import UserError
from workbench.registry import Registry, install_command
from workbench.task import Task


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
