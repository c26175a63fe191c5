"""What a new user hit on a fresh clone (issue 41, item 5): a library's notice under ``--quiet``, defaults and
metavars ``--help`` got wrong, a mistyped task or method refused slowly and without a suggestion, a missing
scikit-learn shown as a raw import error, a summary said twice, and figures too wide to read."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from workbench import cli
from workbench.cli.flags import METAVARS
from workbench.cli.parser import build_parser
from workbench.core.registry import tasks


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter (what a user's shell starts)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)


def _not_installed(*packages: str) -> str:
    """Code that makes ``packages`` fail to import as they do where they are not installed (a meta-path finder
    answering first for them; `importlib.util.find_spec` still sees them)."""
    return textwrap.dedent(
        f"""
        import importlib.abc, importlib.machinery, sys

        class NotInstalled(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {packages!r}:
                    return importlib.machinery.ModuleSpec(name, self)
            def create_module(self, spec):
                raise ModuleNotFoundError(f"No module named {{spec.name!r}}", name=spec.name)
            def exec_module(self, module):
                pass

        sys.meta_path.insert(0, NotInstalled())
        """
    )


@pytest.mark.skipif(importlib.util.find_spec("mace") is None, reason="mace-torch is not installed")
def test_mace_cuequivariance_notice_stays_off_stdout():
    """Without the cueq extra (a fresh install), mace-torch prints its notice on stdout; through the workbench not."""
    without = _not_installed("cuequivariance", "cuequivariance_torch")
    alone = _python(without + "import mace.tools.cg")
    assert "cuequivariance or cuequivariance_torch is not available" in alone.stdout, alone.stderr[-2000:]
    through = _python(without + "import workbench.models, mace.tools.cg; print('after')")
    assert through.returncode == 0, through.stderr[-2000:]
    assert through.stdout == "after\n"


def test_quiet_keeps_info_logs_off_the_console(capsys):
    """A run's logger has its own INFO level (for log.txt); --quiet still keeps its INFO lines off the terminal."""
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)
    root.addHandler(console)
    run_log = logging.getLogger("workbench.run")
    level, root_level = run_log.level, root.level
    try:
        run_log.setLevel(logging.INFO)
        cli._quiet_console()
        run_log.info("an info line")
        run_log.warning("a warning line")
    finally:
        root.removeHandler(console)
        run_log.setLevel(level)
        root.setLevel(root_level)
    err = capsys.readouterr().err
    assert "an info line" not in err and "a warning line" in err


def _help(capsys, monkeypatch, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        cli.main([*args, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_sample_sizes_show_what_a_run_takes(capsys, monkeypatch):
    """ptbxl trains on every sample of its split (declared as a cap of 100,000); rmd17 on 50 frames."""
    text = _help(capsys, monkeypatch, "adapt", "--domain", "ptbxl")
    assert "--train-size INT training samples of the training split (default: every sample of the training split)" \
        in text
    assert "--val-size INT validation samples (default: every sample of the validation split)" in text
    assert "100000" not in text
    text = _help(capsys, monkeypatch, "adapt", "--domain", "rmd17")
    assert "(default: 50)" in text and "every sample" not in text


def _options(parser: argparse.ArgumentParser, path: str = "workbench"):
    """(command, flag or positional, what --help shows after it) for every option of every command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield path, action.dest, action.metavar
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        elif action.nargs != 0 and not action.choices:  # a switch shows nothing; a choice its {a,b}
            words = action.metavar if isinstance(action.metavar, tuple) else (action.metavar,)
            for word in words:
                yield path, (action.option_strings or [action.dest])[0], word


def test_every_option_of_every_command_shows_a_word_of_one_vocabulary():
    seen = list(_options(build_parser(None)))
    assert len(seen) > 100  # every plug-in's options included
    odd = [(command, flag, word) for command, flag, word in seen if word not in METAVARS]
    assert not odd, odd
    assert ("workbench adapt", "--lr", "FLOAT") in seen and ("workbench adapt", "--seed", "SEED") in seen
    assert ("workbench adapt", "--domain", "TASK") in seen and ("workbench data info", "task", "TASK") in seen


def test_domain_is_described_as_what_to_adapt_to_with_its_choices(capsys, monkeypatch):
    text = _help(capsys, monkeypatch, "adapt")
    choices = ", ".join(tasks.declared())
    assert f"--domain TASK the domain to adapt to (its data set and problem): {choices}; `workbench list`" in text
    assert "task name" not in text and {"rmd17", "ptbxl", "medvl"} <= set(tasks.declared())


def test_a_mistyped_task_is_refused_at_once_with_the_close_name():
    """No plug-in module is imported to refuse it, so the refusal costs what parsing costs (the interpreter and
    ``import workbench`` aside)."""
    result = _python(
        """
        import sys, time
        from workbench import cli
        start = time.perf_counter()
        try:
            cli.main(["adapt", "--domain", "rmd71"])
        except SystemExit as exit_:
            print(exit_.code, time.perf_counter() - start)
        print(",".join(m for m in sys.modules if m.startswith(("workbench.domains.", "workbench.adaptation.", "mace"))))
        """
    )
    code, seconds = result.stdout.splitlines()[0].split()
    assert code == "2", result.stderr[-2000:]
    assert "unknown task 'rmd71' (did you mean rmd17?)" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout.splitlines()[1:] in ([], [""])  # no plug-in imported
    assert float(seconds) < 2.0


def test_a_mistyped_method_is_refused_offering_the_methods_of_the_task(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["adapt", "--domain", "features", "--method", "warmpott"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "unknown method 'warmpott' (did you mean warmpot?)" in error
    offered = set(error.split("checked when a run starts):", 1)[1].strip().split(", "))
    assert {"full", "readout", "warmpot", "pada", "oracle", "dre-pp", "dre-ulsif", "dre-kliep", "dre-logistic"} \
        <= offered
    assert not offered & {"elora", "mace-lora", "homophily", "udagcn", "hlora", "physiopfm", "distill"}


def test_list_without_scikit_learn_names_the_package_and_its_install_command():
    result = _python(_not_installed("sklearn") + "from workbench.cli.listing import _list\nprint(_list())")
    assert result.returncode == 0, result.stderr[-2000:]
    listing = " ".join(result.stdout.split())  # a long name has a line of its own; texts wrap
    for name in ("dre-ulsif", "dre-kliep", "dre-logistic"):
        assert f'method {name} scikit-learn not installed: pip install "sciadapt-workbench[shift]"' in listing, listing
    assert 'task sleepedf scikit-learn not installed: pip install "sciadapt-workbench[eeg]"' in listing  # its own extra
    assert "ModuleNotFoundError" not in result.stdout


def test_data_info_says_no_record_skipped_once(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["data", "info", "ptbxl"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.count("no record skipped") == 1


def test_confusion_matrices_of_nine_methods_wrap_into_readable_rows(tmp_path):
    from matplotlib.image import imread
    from workbench.domains.plots import PANELS_PER_ROW, confusion_matrices

    from workbench.core.task import Evaluation

    rng = np.random.default_rng(0)
    truth = rng.integers(0, 4, 500)
    evaluations = {f"method {k}": Evaluation({}, {"truth": truth, "predicted": rng.integers(0, 4, 500)})
                   for k in range(9)}  # fmt: skip
    confusion_matrices(evaluations, ("N", "S", "V", "F"), tmp_path, samples="beats")
    height, width = imread(tmp_path / "confusion_matrices.png").shape[:2]
    assert width <= 1400 and height > 2.5 * width / PANELS_PER_ROW  # three rows of four
