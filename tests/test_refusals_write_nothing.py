"""Every refusal of ``workbench adapt`` comes before the run directory exists: through the real command line
(`workbench.cli.main`), each bad request exits 2 with one error line and leaves no ``--out`` behind, so the corrected
command can use the same ``--out``. And ``adapt --help`` offers only the choices the chosen method takes."""

from __future__ import annotations

import pytest
from test_task_method_contract import APPLIES

from workbench import cli
from workbench.core.registry import methods

#: Tasks whose embedded data take many seconds to read on a laptop CPU: their data-level refusals run under ``slow``.
SLOW_READS = {"ptbxl", "rmd17", "medvl"}

#: (id, adapt arguments, a phrase of the message): refusals of options alone (no data read).
OPTION_REFUSALS = [
    ("goat-on-htuning", ["--domain", "ptbxl", "--init", "goat"], "--method lora --init goat"),
    ("goat-scale-on-htuning", ["--domain", "ptbxl", "--lora-scaling", "goat"], "--method lora --init goat"),
    ("goat-on-elora", ["--domain", "rmd17", "--method", "elora", "--init", "goat"], "breaks equivariance"),
    (
        "goat-scale-without-goat",
        ["--domain", "ptbxl", "--method", "lora", "--lora-scaling", "goat"],
        "--lora-scaling goat needs --init goat",
    ),
    (
        "dora-on-goat",
        ["--domain", "ptbxl", "--method", "lora", "--init", "goat", "--dora"],
        "--dora needs --init kaiming, pissa or lora-one (got --init goat)",
    ),
    (
        "replora-on-goat",
        ["--domain", "ptbxl", "--method", "lora", "--init", "goat", "--reparam", "replora"],
        "--reparam replora needs --init kaiming and no --dora (got --init goat)",
    ),
    (
        "flat-lora-on-goat",
        ["--domain", "ptbxl", "--method", "lora", "--init", "goat", "--objective", "flat-lora"],
        "--objective flat-lora needs",
    ),
    (
        "replora-with-pissa",
        ["--domain", "ptbxl", "--method", "htuning", "--init", "pissa", "--reparam", "replora"],
        "give --init kaiming, or use --reparam none",
    ),
    ("replora-with-dora", ["--domain", "rmd17", "--method", "elora", "--dora", "--reparam", "replora"], "(got --dora)"),
    (
        "goat-experts-not-dividing-rank",
        ["--domain", "ptbxl", "--method", "lora", "--init", "goat", "--experts", "3"],
        "give --experts that divides --rank",
    ),
    (
        "goat-top-k-above-experts",
        ["--domain", "ptbxl", "--method", "lora", "--init", "goat", "--top-k", "9"],
        "--top-k 9 must be in 1..8",
    ),
    (
        "lora-one-gamma",
        ["--domain", "ptbxl", "--method", "lora", "--init", "lora-one", "--gamma", "0"],
        "--gamma must be positive",
    ),
    ("lora-rank", ["--domain", "ptbxl", "--method", "lora", "--rank", "0"], "rank must be a positive integer"),
    ("htuning-alpha", ["--domain", "ptbxl", "--method", "htuning", "--alpha", "-1"], "alpha must be positive"),
    ("elora-rank", ["--domain", "rmd17", "--method", "elora", "--rank", "0"], "rank must be a positive integer"),
    ("mace-lora-rank", ["--domain", "rmd17", "--method", "mace-lora", "--rank", "0"], "--rank must be a positive"),
    ("lift-rank", ["--domain", "physio", "--method", "lift", "--rank", "0"], "--rank must be a positive integer"),
    ("physiopfm-draws", ["--domain", "physio", "--method", "physiopfm", "--draws", "0"], "--draws must be at least"),
    (
        "physiopfm-held-out",
        ["--domain", "physio", "--method", "physiopfm-mean", "--held-out", "1.5"],
        "--held-out must be in [0, 1)",
    ),
    ("mistyped-choice", ["--domain", "ptbxl", "--method", "lora", "--init", "kaiming-uniform"], "invalid choice"),
    ("mistyped-number", ["--domain", "physio", "--method", "lora", "--rank", "eight"], "invalid int value"),
    ("mistyped-flag", ["--domain", "physio", "--method", "lora", "--rnak", "8"], "--rnak is not an option"),
    ("mistyped-method", ["--domain", "physio", "--method", "loar"], "loar"),
    ("bad-learning-rate", ["--domain", "physio", "--lr", "-1"], "--lr must be positive"),
    ("bad-ema", ["--domain", "physio", "--ema-decay", "1.5"], "--ema-decay must be in [0, 1)"),
    ("bad-select-on", ["--domain", "physio", "--select-on", "accuracy!"], "--select-on accuracy!"),
    ("batch-above-train-size", ["--domain", "physio", "--batch-size", "64", "--train-size", "16"], "--batch-size 64"),
]

#: Refusals that need the task's data and model (read, then refused before the run directory).
DATA_REFUSALS = [
    (
        "pissa-rank-above-weight",
        ["--domain", "physio", "--method", "lora", "--init", "pissa", "--rank", "4096"],
        "too large for init='pissa'",
    ),
    (
        "lora-one-rank-above-weight",
        ["--domain", "physio", "--method", "lora", "--init", "lora-one", "--rank", "4096"],
        "too large for init='lora-one'",
    ),
    (
        "goat-expert-rank-above-segment",
        ["--domain", "physio", "--method", "lora", "--init", "goat", "--rank", "4096", "--experts", "8"],
        "GOAT cuts the 64 singular values",
    ),
    (
        "goat-on-a-convolution",
        ["--domain", "sleepedf", "--method", "lora", "--init", "goat", "--targets", "*conv*"],
        "LoRA target",
    ),
    (
        "lift-target-in-trained-head",
        ["--domain", "physio", "--method", "lift", "--targets", "head"],
        "--head train trains in full",
    ),
    (
        "physiopfm-unknown-bank-site",
        ["--domain", "physio", "--method", "physiopfm", "--bank-sites", "Z"],
        "--bank-sites",
    ),
    (
        "batch-above-data",
        ["--domain", "physio", "--train-size", "4000", "--batch-size", "4000"],
        "fewer than one batch",
    ),
    ("data-not-a-folder", ["--domain", "physio", "--data", "{file}"], "no such folder"),
    ("data-file-not-a-table", ["--domain", "features", "--data", "{folder}"], "source.csv"),
]


def incompatible_pairs() -> list:
    """Every (task, method) the contract table says does not apply: the first of each task in the default suite
    (where the task's data read fast), every other one under ``slow``."""
    params = []
    for task, applies in sorted(APPLIES.items()):
        for index, method in enumerate(sorted(set(methods.names()) - applies)):
            slow = index > 0 or task in SLOW_READS
            params.append(pytest.param(task, method, id=f"{task}-{method}", marks=[pytest.mark.slow] if slow else []))
    return params


def refused(arguments: list[str], out, capsys) -> str:
    """Run ``workbench adapt ARGUMENTS --out OUT --quiet --epochs 1``; assert exit 2, one error line, no traceback and
    no ``out``; return the error line."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["adapt", *arguments, "--out", str(out), "--quiet", "--epochs", "1"])
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert exit_.value.code == 2, stderr
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert not out.exists(), f"{out} was written before the refusal: {errors[0]}"
    return errors[0]


@pytest.mark.parametrize("arguments, phrase", [pytest.param(a, p, id=i) for i, a, p in OPTION_REFUSALS])
def test_an_option_refusal_writes_nothing(arguments, phrase, tmp_path, capsys):
    assert phrase in refused(arguments, tmp_path / "run", capsys)


@pytest.mark.parametrize("arguments, phrase", [pytest.param(a, p, id=i) for i, a, p in DATA_REFUSALS])
def test_a_refusal_after_reading_the_data_writes_nothing(arguments, phrase, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a record\n")
    (tmp_path / "tables").mkdir()
    for name in ("source.csv", "target.csv"):
        (tmp_path / "tables" / name).write_bytes(b"\x00\x01 not a table \xff\n")
    paths = {"{file}": str(tmp_path / "notes.txt"), "{folder}": str(tmp_path / "tables")}
    arguments = [paths.get(word, word) for word in arguments]
    assert phrase in refused(arguments, tmp_path / "run", capsys)


@pytest.mark.parametrize("task, method", incompatible_pairs())
def test_a_method_the_task_refuses_writes_nothing(task, method, tmp_path, capsys):
    assert f"'{method}'" in refused(["--domain", task, "--method", method], tmp_path / "run", capsys)


def test_the_corrected_goat_command_takes_the_same_out(tmp_path, capsys):
    """The report of issue 41: ``--init goat`` on the task's default method (htuning) is refused, and the command the
    message names parses and resolves with the same ``--out`` (nothing is in the way)."""
    from workbench.core.config import RunRequest, resolve_config

    message = refused(["--domain", "ptbxl", "--init", "goat"], tmp_path / "run", capsys)
    assert "--method lora --init goat" in message
    config, _ = resolve_config(RunRequest(domain="ptbxl", method="lora", out=str(tmp_path / "run"),
                                          method_options={"init": "goat", "lora_scaling": "goat"}))  # fmt: skip
    assert config.method_options["init"] == "goat" and not (tmp_path / "run").exists()


def method_help(capsys, *arguments: str) -> str:
    with pytest.raises(SystemExit):
        cli.main(["adapt", *arguments, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone


def test_help_offers_only_what_the_method_takes(capsys):
    htuning = method_help(capsys, "--domain", "ptbxl")  # the task's default method
    assert "--init {kaiming,pissa,lora-one} " in htuning and "--lora-scaling {standard,rslora} " in htuning
    assert "goat" not in htuning.split("options of method htuning")[1]
    lora = method_help(capsys, "--domain", "ptbxl", "--method", "lora")
    assert "--init {kaiming,pissa,lora-one,goat} " in lora
    assert "--lora-scaling {standard,rslora} " in lora and "(with --init goat: also goat)" in lora
    assert "--dora only with --init kaiming, pissa or lora-one" in lora
    elora = method_help(capsys, "--domain", "rmd17", "--method", "elora")
    assert "--init {kaiming,pissa,lora-one} " in elora and "--lora-scaling {standard,rslora} " in elora
    assert "only with --init kaiming, pissa or lora-one" not in elora  # no init of ELoRA's is GOAT's: unsaid
