"""What a person reads from the command line: ``adapt --help`` for one task and one method (each plug-in's own
option texts and the task's real defaults, no argparse ``OPT_`` names) and ``workbench list`` in aligned columns.
In process (``cli.main``), so no test pays for a fresh interpreter."""

from __future__ import annotations

import re

import pytest

from workbench import cli
from workbench.cli.listing import _list
from workbench.core.registry import methods, models, tasks


def _help(capsys, monkeypatch, *args: str) -> str:
    """``workbench adapt ARGS --help`` as printed on an 100-column terminal, each flag's text joined onto one line."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["adapt", *args, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _flag_text(help_text: str, flag: str) -> str:
    """The help of one flag, its wrapped lines joined by single spaces."""
    match = re.search(rf"^  {re.escape(flag)}\b(.*?)(?=^  -|^\S|\Z)", help_text, re.M | re.S)
    assert match, f"{flag} is not in the help"
    return " ".join(match.group(1).split())


def test_help_of_a_method_shows_its_own_option_texts_and_defaults(capsys, monkeypatch):
    """lora and hlora both take --rank; each one's help shows its own text and default (the option of the method
    asked for, not of the first plug-in that declares the name), and no other method's options."""
    lora = _help(capsys, monkeypatch, "--domain", "ptbxl", "--method", "lora")
    own = {option.name: option for option in methods.get("lora").options}
    assert _flag_text(lora, "--rank") == f"INT {own['rank'].help} (default: {own['rank'].default})"
    assert "ELoRA" not in lora and "options of method lora" in lora and "options of task ptbxl" in lora
    assert "--generation-rank" not in lora  # hlora's
    hlora = _help(capsys, monkeypatch, "--domain", "medvl", "--method", "hlora")
    own = {option.name: option for option in methods.get("hlora").options}
    assert _flag_text(hlora, "--rank") == f"INT {own['rank'].help} (default: {own['rank'].default})"
    assert _flag_text(hlora, "--alpha").endswith(f"(default: {own['alpha'].default})")


def test_help_of_a_task_shows_its_real_defaults_and_its_methods(capsys, monkeypatch):
    """The task's own training defaults (not the engine's fallbacks), its default method and baselines."""
    task = tasks.get("features")
    text = _help(capsys, monkeypatch, "--domain", "features")
    for flag, key in (("--epochs", "epochs"), ("--train-size", "train_size"), ("--batch-size", "batch_size"),
                      ("--patience", "patience")):  # fmt: skip
        assert _flag_text(text, flag).endswith(f"(default: {task.defaults[key]})"), flag
    assert _flag_text(text, "--method").endswith(f"(default: {task.default_method})")
    assert f"options of method {task.default_method}" in text
    for baseline in task.profile(task.default_method).get("baselines", task.baselines):
        assert baseline in _flag_text(text, "--baselines")
    assert "workbench adapt --domain features --method METHOD --help" in text


@pytest.mark.parametrize("args", [(), ("--domain", "features"), ("--domain", "csbm", "--method", "udagcn")])
def test_help_names_types_not_argparse_destinations_and_says_each_default_once(capsys, monkeypatch, args):
    text = _help(capsys, monkeypatch, *args)
    assert "OPT_" not in text
    assert "(default: )" not in text and "default: None" not in text
    for line in re.split(r"\n  -", text):
        assert " ".join(line.split()).count("(default") <= 1, line


def test_help_without_a_task_points_to_the_task_help(capsys, monkeypatch):
    text = _help(capsys, monkeypatch)
    assert "workbench adapt --domain TASK --help" in text and "workbench list" in text
    assert "options of task" not in text and "options of method" not in text


def test_a_flag_of_another_method_is_refused_naming_where_to_look(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["adapt", "--domain", "features", "--method", "pada", "--mass", "0.3"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--mass is not an option of task 'features' or method 'pada'" in error
    assert "workbench adapt --domain features --method pada --help" in error and "Traceback" not in error


def test_list_columns_are_aligned_and_missing_extras_named_one_way(monkeypatch):
    """Every name starts a row whose text begins in one column, at least two spaces after the name (a longer name
    has a line of its own); a plug-in whose library is missing is named with the pip command of its extra."""
    monkeypatch.setitem(tasks.unavailable, "eeg-example", "ModuleNotFoundError: No module named 'mne'")
    monkeypatch.setenv("COLUMNS", "100")
    listing = _list()
    names = {*tasks.names(), *models.names(), *methods.names()}
    names |= {f"{kind} {name}" for kind, r in (("task", tasks), ("model", models), ("method", methods))
              for name in r.unavailable}  # fmt: skip
    columns = set()
    for line in listing.splitlines():
        if not re.match(r"  \S", line):
            continue
        gap = re.search(r"\S(  +)\S", line)
        if gap is None:  # a name on a line of its own
            assert line.strip() in names, line
            continue
        assert line[2 : gap.start() + 1] in names, line  # the name ends where the gap begins
        columns.add(gap.end() - 1)
    assert len(columns) == 1, columns
    column = columns.pop()
    for line in listing.splitlines():
        assert len(line) <= 100 or " " not in line[column:].strip(), line  # wrapped to the terminal
        if line.startswith(" ") and not re.match(r"  \S", line):
            assert len(line) - len(line.lstrip()) >= column, line  # continuation lines stay in the text column
    assert "eeg-example" in listing and 'not installed: pip install "sciadapt-workbench[eeg]"' in listing
    assert "pip install -e" not in listing


def test_report_counts_epochs_from_1_and_its_columns_carry_units(caplog):
    """metrics.json numbers epochs from 0; the report table and the console count them from 1 and say so."""
    import types

    import torch

    from workbench.core.config import RunRequest, resolve_config
    from workbench.core.trainer import Trainer, TrainSettings
    from workbench.run import report

    cost = {"trainable_parameters": 10, "seconds_per_epoch": 0.1, "training_step_bytes": 2**20, "epochs": 5,
            "best_epoch": 2}  # fmt: skip
    metrics = {"task": "t", "samples": {"train": 3, "val": 1, "test": 2}, "before": {"mean": 1.0},
               "after": {"mean": 0.5}, "baselines": {}, "costs": {"m": cost}, "method": "m"}  # fmt: skip
    config = resolve_config(RunRequest(domain="features", out="x"))[0]
    text = report.markdown(config, types.SimpleNamespace(source="x"), metrics, [], ("mean",))
    header = next(line for line in text.splitlines() if line.startswith("| model"))
    assert header.endswith("| trainable params | s/epoch | step MiB | epochs run (best, from 1) |")
    row = next(line for line in text.splitlines() if line.startswith("| m (this run's method)"))
    assert row.endswith("| 10 | 0.10 | 1.0 | 5 (3) |")
    console_header = report.table(metrics, ("mean",)).splitlines()[2]
    assert re.split(r"\s{2,}", console_header)[-4:] == ["trainable params", "s/epoch", "step MiB", "epochs run"]

    # The console: a validation loss that only grows stops after patience + 1 epochs, the first one the best.
    calls = {"val": 0}
    weight = torch.nn.Parameter(torch.zeros(1))
    model = torch.nn.Module()
    model.weight = weight

    def loss(model, batch, training):
        if not training:
            calls["val"] += 1
        return (model.weight**2).sum() + calls["val"]

    settings = TrainSettings(epochs=10, batch_size=1, patience=2, ema_decay=None)
    trainer = Trainer(model, loss, lambda samples, device: samples, [0], [0], settings, progress=False)
    with caplog.at_level("INFO", logger="workbench.core.trainer"):
        history = trainer.fit()
    assert len(history) == 3 and trainer.best["epoch"] == 0  # metrics.json's numbering
    assert "train: early stop after epoch 3 (best 1; from 1)" in caplog.text
