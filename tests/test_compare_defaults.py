"""`workbench compare`'s default design reaches a verdict, the design is said before any cell runs (and by
``--plan``), and ``compare --help`` shows real examples and every default."""

from __future__ import annotations

import argparse
import logging
import shlex

import pytest

from workbench import cli
from workbench.cli.compare import COMPARE_EXAMPLES, _compare_spec
from workbench.cli.parser import build_parser, parse
from workbench.comparison import cells, statistics
from workbench.comparison.design import FIRST_REPORTED_SEED, CompareSpec
from workbench.comparison.execute import compare
from workbench.comparison.report import design

#: A features comparison small enough for the default suite (as tests/test_compare.py's).
TINY = {"epochs": 1, "train_size": 60, "val_size": 20, "batch_size": 20, "task_options": {"pretrain_epochs": 20}}


def test_the_default_design_has_enough_reported_seeds_for_a_verdict_and_the_cli_takes_it():
    spec = CompareSpec("features", ("full", "warmpot"))
    assert len(spec.seeds) >= statistics.MIN_UNITS and min(spec.seeds) == FIRST_REPORTED_SEED
    assert not spec.development
    line, problem = design(spec)
    assert problem is None
    assert line.startswith(f"design: {spec.folds} folds × {len(spec.seeds)} seeds = {spec.folds * len(spec.seeds)} "
                           f"cells per method, {2 * spec.folds * len(spec.seeds)} in all")  # fmt: skip
    assert f"verdicts need ≥ {statistics.MIN_UNITS} units" in line
    given = _compare_spec(parse(["compare", "--domain", "features", "--methods", "full,warmpot"]))
    assert given == spec  # the command line's defaults are the spec's


@pytest.mark.parametrize(
    "methods, seeds, fixes",
    [
        (("full", "warmpot"), (100, 101), ["2 seeds, fewer than 3 units", "give --seeds 100-102"]),
        (("full",), (5,), ["one method (full) has nothing to be paired with", "give --seeds 5-7"]),
        (("full",), (100, 101, 102), ["name two or more in --methods"]),
    ],
)
def test_a_design_that_cannot_give_a_verdict_says_why_and_the_fix(methods, seeds, fixes):
    _, problem = design(CompareSpec("features", methods, folds=2, seeds=seeds))
    assert problem.startswith("cannot give a verdict: ") and all(fix in problem for fix in fixes)
    assert ("--seeds" in problem) == (len(seeds) < statistics.MIN_UNITS)


def test_compare_says_its_design_before_the_first_cell_runs(tmp_path, capsys, caplog, monkeypatch):
    spec = CompareSpec("features", ("full",), folds=2, seeds=(0,), **TINY)
    printed_before_cells = []
    real = cells.run_cell

    def first_seeing(*args, **kwargs):  # the real cell, after noting what was printed before it
        printed_before_cells.append(capsys.readouterr().out)
        return real(*args, **kwargs)

    monkeypatch.setattr(cells, "run_cell", first_seeing)
    compare(spec, tmp_path / "c")
    line, problem = design(spec)
    assert line.startswith("design: 2 folds × 1 seed = 2 cells per method, 2 in all")
    assert printed_before_cells[0].splitlines()[:2] == [line, problem]
    assert "give --seeds 0-2" in problem
    capsys.readouterr()  # the first run's table
    caplog.set_level(logging.WARNING, logger="workbench")
    compare(spec, tmp_path / "c", quiet=True)  # every cell recorded: quiet says only what cannot give a verdict
    assert capsys.readouterr().out == ""
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING] == [problem]


def test_compare_plan_states_the_same_design(capsys):
    argv = ["compare", "--plan", "--domain", "features", "--methods", "full,warmpot", "--seeds", "100-101", "--sd",
            "0.02"]  # fmt: skip
    assert cli.run(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    line, problem = design(_compare_spec(parse(argv)))
    assert line in printed and problem in printed


def _compare_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser({})._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["compare"]


def test_compare_help_shows_examples_that_parse_and_every_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["compare", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "(default: steps)" in " ".join(text.split("--budget")[1].split()[:20])
    examples = COMPARE_EXAMPLES.splitlines()[1:]
    assert 3 <= len(examples) <= 5 and all(example in text for example in examples)
    for example in examples:  # each a real command line: it parses and its spec passes the checks
        words = shlex.split(example.split("#")[0].replace("TASK", "features").replace("A,B,C", "full,warmpot,pada")
                            .replace("A,B", "full,warmpot").replace("--learner B", "--learner warmpot"))
        assert words[:2] == ["workbench", "compare"]
        _compare_spec(parse(words[1:])).check()
    for action in _compare_parser()._actions:
        if action.default not in (None, False, [], argparse.SUPPRESS):
            assert "(default" in action.help, action.option_strings
