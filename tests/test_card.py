"""``workbench card RUN``: a model card written from a finished run's own files — every number copied from the file
the card names (checked here against those files), "not fitted" where a run has no calibration, and an "Intended
use" section left to the user; written outside every run folder, never over an earlier card unless asked."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

pytest.importorskip("wfdb")
from workbench.cli import main  # noqa: E402
from workbench.clinical.card import INTENDED_USE, card_text  # noqa: E402

SECTIONS = ["## The run", "## Data provenance", "## Method", "## Metrics on the held-out test split", "## Calibration",
            "## Conformal prediction sets", "## Shift test", "## Known limits", "## Intended use"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("card") / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["adapt", "--domain", "ptbxl", "--method", "readout", "--epochs", "1", "--baselines", "", "--train-size",
              "8", "--val-size", "8", "--quiet", "--out", str(out)])  # fmt: skip
    assert exit_info.value.code == 0
    return out


def cli(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_the_card_copies_the_run_s_numbers(run_dir):
    text = card_text(run_dir)
    assert [line for line in text.splitlines() if line.startswith("## ")] == SECTIONS
    metrics = json.loads((run_dir / "metrics.json").read_text())
    clinical = json.loads((run_dir / "clinical.json").read_text())
    after, low_high = metrics["after"]["macro_auroc"], metrics["intervals"]["after"]["macro_auroc"]
    row = next(line for line in text.splitlines() if line.startswith("| macro_auroc |"))
    assert f"{after:.3f} [{low_high[0]:.3f}, {low_high[1]:.3f}]" in row
    difference = metrics["differences"]["after − before"]["macro_auroc"]
    assert row.endswith(f"{difference['estimate']:.3f} [{difference['low']:.3f}, {difference['high']:.3f}] |")
    c = clinical["calibration"]
    assert f"{c['ece_before']:.3f} before, {c['ece_after']:.3f} after" in text
    assert f"{c['temperatures'][0]:.2f}" in text.split("Temperatures: ", 1)[1].splitlines()[0]
    k = clinical["conformal"]
    assert f"Nominal coverage 90 % (α = {k['alpha']})" in text
    assert f"coverage on the test split: {k['test_coverage']:.3f} over {k['test_items']} items" in text
    assert clinical["shift"]["test_split"]["verdict"] in text.split("## Shift test", 1)[1]
    assert hashlib.sha256((run_dir / "adapter.safetensors").read_bytes()).hexdigest() in text
    assert "Not fitted" not in text and text.rstrip().endswith(INTENDED_USE.rstrip())
    assert "ptbxl-synthetic" in text and "| seal check now | verified |" in text


def test_a_run_without_calibration_says_not_fitted_and_that_it_changed(run_dir, tmp_path):
    copy = shutil.copytree(run_dir, tmp_path / "older", ignore=shutil.ignore_patterns(".*"))
    for name in ("clinical.json", "clinical.npz", "reliability.png"):
        (copy / name).unlink(missing_ok=True)
    text = card_text(copy)
    for section in ("## Calibration", "## Conformal prediction sets", "## Shift test"):
        assert text.split(section, 1)[1].lstrip().startswith("Not fitted"), section
    assert "files differ from its seal" in text and "clinical.json" in text.split("## Known limits", 1)[1]
    assert "the probabilities are the model's raw outputs" in text


def test_the_command_writes_outside_run_folders_and_never_over_a_card(run_dir, tmp_path, capsys):
    output = tmp_path / "cards" / "model-card.md"
    code, out, _ = cli(["card", run_dir, "--output", output], capsys)
    assert code == 0 and str(output) in out and output.read_text().startswith("# Model card: task `ptbxl`")
    code, _, err = cli(["card", run_dir, "--output", output], capsys)
    assert code == 2 and "--overwrite" in err
    assert cli(["card", run_dir, "--output", output, "--overwrite"], capsys)[0] == 0
    before = sorted(p.name for p in run_dir.iterdir())
    code, _, err = cli(["card", run_dir, "--output", run_dir / "card.md"], capsys)
    assert code == 2 and "inside the run folder" in err and sorted(p.name for p in run_dir.iterdir()) == before
    code, _, err = cli(["card", run_dir, "--output", tmp_path / "card.txt"], capsys)
    assert code == 2 and ".md" in err
    code, _, err = cli(["card", tmp_path, "--output", tmp_path / "x.md"], capsys)
    assert code == 2 and "not a finished run" in err


def test_the_card_says_what_each_number_rests_on(run_dir):
    """Too few validation items: the card says no temperature was fitted and why, that every conformal set holds
    every class, and counts the best epoch from 1 as the console does."""
    text = card_text(run_dir)
    clinical = json.loads((run_dir / "clinical.json").read_text())
    c, k = clinical["calibration"], clinical["conformal"]
    assert c["fit_items"] < c["min_fit_items"] and len(c["unfitted_classes"]) == len(c["temperatures"])
    assert (f"no temperature was fitted: {c['fit_items']} fitting item(s), below the {c['min_fit_items']} that "
            "fitting needs") in text  # fmt: skip
    assert "(nothing fitted: the same probabilities)" in text
    assert all(q is None for q in k["quantiles"]) and "Every set holds every class (5)" in text
    best = json.loads((run_dir / "metrics.json").read_text())["costs"]["readout"]["best_epoch"]
    assert f"(best {best + 1}, counted from 1 as on the console)" in text
    assert "Against the baselines" not in text  # the run had none


def test_the_card_and_predict_say_the_method_s_standing_and_the_batch_s_verdicts(tmp_path, capsys):
    from workbench.domains.ecg.readers import EMBEDDED_PTBXL

    from workbench.core.registry import tasks
    from workbench.core.verdicts import verdict

    run = tmp_path / "run"
    code, _, _ = cli(["adapt", "--domain", "ptbxl", "--method", "readout", "--epochs", "1", "--baselines", "full",
                      "--quiet", "--out", run], capsys)  # fmt: skip
    assert code == 0
    metrics = json.loads((run / "metrics.json").read_text())
    said = verdict(metrics, list(tasks.get("ptbxl").metrics), tasks.get("ptbxl").lower_is_better)
    assert said and f"Against the baselines run beside it: {said}" in card_text(run)
    code, out, _ = cli(["predict", "--run", run, "--input", EMBEDDED_PTBXL / "records100" / "00000", "--output",
                        tmp_path / "p.csv"], capsys)  # fmt: skip
    record = json.loads((tmp_path / "p.json").read_text())
    shift, sets = record["clinical"]["shift"], record["clinical"]["sets"]
    assert code == 0 and f"shift: {shift['verdict']} (statistic" in out and f"p = {shift['p_value']:.3g}" in out
    rows = (tmp_path / "p.csv").read_text().splitlines()
    column = rows[0].split(",").index("conformal_set")
    full = sum(len(row.split(",")[column].split("|")) == 5 for row in rows[1:])  # every class in the set
    assert sets["items"] == len(rows) - 1 and sets["all_classes"] == full
    assert f"conformal sets: {full} of {len(rows) - 1} hold every class (5)" in out
