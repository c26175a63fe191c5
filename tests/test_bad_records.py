"""One bad-record policy for every task: skipped records are counted in the table, listed in ``metrics.json`` and
``report.md``; ``data check`` says "ok" only when nothing was skipped. (Each domain's readers are tested on real
damaged files in its own tests; here the engine's side, with a task whose reader skips what it cannot parse.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from workbench import cli
from workbench.core.records import ON_BAD_RECORD, BadRecordError, SkipReport
from workbench.core.registry import tasks
from workbench.core.task import Task
from workbench.run import report


def test_every_task_takes_the_policy():
    for name, cls in tasks.items():
        assert ON_BAD_RECORD in cls.options, name
        assert [option.name for option in cls.options].count("on_bad_record") == 1, name


def test_skip_report_headline_and_json():
    report_ = SkipReport(seen=7)
    report_.add("a.csv", "line 3: not a number")
    assert report_.headline() == "1 of 7 record(s) skipped"
    assert report_.to_json() == {
        "skipped": 1,
        "seen": 7,
        "records": [{"record": "a.csv", "problem": "line 3: not a number"}],
    }
    other = SkipReport(seen=2)
    other.add("b.csv", "empty")
    report_.extend(other)
    assert len(report_) == 2 and report_.seen == 9


class _NumberFiles(Task):
    """A folder of ``*.txt`` files, one number each; a file that does not hold a number is a bad record."""

    name = "number-files"
    description = "test task"
    card = "none"
    default_model = "none"
    default_method = "none"
    metrics = ("mean",)

    def info(self, data):
        values = []
        self.skipped = SkipReport()
        for path in sorted(Path(data).glob("*.txt")):
            self.skipped.seen += 1
            try:
                values.append(float(path.read_text()))
            except ValueError:
                if self.config["on_bad_record"] == "raise":
                    raise BadRecordError(path, "expected one number") from None
                self.skipped.add(path, "expected one number")
        return f"{len(values)} number(s)"


@pytest.fixture
def number_files(tmp_path, monkeypatch):
    monkeypatch.setitem(tasks._classes, _NumberFiles.name, _NumberFiles)
    for index, text in enumerate(["1.5", "2", "two", "4"]):
        (tmp_path / f"{index}.txt").write_text(text)
    return tmp_path


def test_data_check_says_ok_only_when_nothing_was_skipped(number_files, capsys):
    assert cli.run(["data", "check", "number-files", "--data", str(number_files)]) == 1
    out = capsys.readouterr().out
    assert "not ok: 1 of 4 record(s) skipped" in out and "2.txt: expected one number" in out
    (number_files / "2.txt").write_text("3")
    assert cli.run(["data", "check", "number-files", "--data", str(number_files)]) == 0
    assert "ok:" in capsys.readouterr().out


def test_raise_policy_exits_2_naming_the_file(number_files, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["data", "check", "number-files", "--data", str(number_files), "--on-bad-record", "raise"])
    assert exit_.value.code == 2
    assert "2.txt: expected one number" in capsys.readouterr().err


def test_table_and_report_show_the_skipped_records():
    metrics = {
        "task": "t",
        "samples": {"train": 3, "val": 1, "test": 2},
        "before": {"mean": 1.0},
        "after": {"mean": 0.5},
        "baselines": {},
        "costs": {
            "m": {"trainable_parameters": 10, "seconds_per_epoch": 0.1, "training_step_bytes": None, "epochs": 1}
        },
        "method": "m",
        "skipped_records": {
            "skipped": 1,
            "seen": 4,
            "records": [{"record": "x/2.txt", "problem": "expected one number"}],
        },
    }
    table = report.table(metrics, ("mean", "absent"))
    assert "1 of 4 record(s) skipped" in table
    after = next(line for line in table.splitlines() if line.startswith("m (this run's method)"))
    assert after.split()[4:6] == ["0.50", "-"]  # a metric the data give none of is shown as "-"


def test_a_default_batch_larger_than_the_data_shrinks_to_it_and_a_given_one_is_refused(tmp_path, caplog):
    """A real data set can be smaller than a task's default batch (one EEGMMIDB run holds 15 trials)."""
    from workbench.core.errors import UserError
    from workbench.run.adapting import _fitted_batch_size

    config = dataclasses.replace(_any_config(), batch_size=16)
    assert _fitted_batch_size(config, 40, given=False).batch_size == 16
    assert _fitted_batch_size(config, 10, given=False).batch_size == 10
    with pytest.raises(UserError, match="--batch-size 16: the data give 10 training sample"):
        _fitted_batch_size(config, 10, given=True)


def _any_config():
    from workbench.core.config import RunRequest, resolve_config

    return resolve_config(RunRequest(domain="features", out="x"))[0]
