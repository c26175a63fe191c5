"""Each run setting is declared once (`workbench.core.settings.SETTINGS`): a new declaration is a flag of ``adapt`` and
``compare``, a key of ``config.yaml``, a keyword of ``workbench.adapt`` and a field of ``CompareSpec``, checked in one
place. A renamed option or setting keeps its earlier name working, with one warning line, for one minor version
(``--scaling`` of the LoRA methods first, where the task does not take ``--scaling`` itself)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import yaml

from workbench import cli
from workbench.cli.adapt import adapt_request
from workbench.cli.compare import _compare_spec
from workbench.cli.parser import parse
from workbench.core.config import RunRequest, resolve_config
from workbench.core.finished import Run
from workbench.core.options import RenamedFrom
from workbench.core.registry import methods, tasks
from workbench.core.settings import SETTINGS
from workbench.run.resume import check_out_dir

#: Adds one setting before any engine module builds its classes, then asks every surface for it.
_ONE_MORE_SETTING = """
import sys, yaml
from workbench.core import settings

probe = settings.Setting(
    "probe_share", float, 0.25, "a share only this test declares", ("adapt", "compare"),
    check=lambda values, task_cls: None if 0 <= values["probe_share"] <= 1 else "--probe-share must be in [0, 1]",
)
settings.SETTINGS = (*settings.SETTINGS, probe)

import workbench
from workbench import cli
from workbench.comparison.design import Cell, CompareSpec, cell_request
from workbench.core.config import resolve_config

def help_of(*argv):
    try:
        cli.main([*argv, "--help"])
    except SystemExit:
        pass

help_of("adapt", "--domain", "features")
print("====")
help_of("compare")
print("====")
spec = CompareSpec("features", ("full",), probe_share=0.5)
request = cell_request(spec, Cell("full", 0, 0, {"test": ["a"]}), ".", None, None)
print("cell", request.probe_share, resolve_config(request)[0].probe_share)
run = workbench.adapt(domain="features", baselines=(), epochs=1, train_size=40, val_size=10, batch_size=10, quiet=True,
                      out=sys.argv[1], probe_share=0.75, pretrain_epochs=2)
print("config.yaml", yaml.safe_load(open(sys.argv[1] + "/config.yaml"))["probe_share"], run.config.probe_share)
cli.main(["adapt", "--domain", "features", "--probe-share", "2", "--out", sys.argv[1] + "-refused"])
"""


def test_one_new_declaration_is_a_flag_a_config_key_and_a_keyword(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-c", _ONE_MORE_SETTING, str(run_dir)], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    adapt_help, compare_help, rest = (" ".join(part.split()) for part in result.stdout.split("===="))
    for text in (adapt_help, compare_help):
        assert "--probe-share FLOAT a share only this test declares (default: 0.25)" in text
    assert "cell 0.5 0.5" in rest  # the spec hands it to every cell's run
    assert "config.yaml 0.75 0.75" in rest
    assert result.returncode == 2, result.stderr[-2000:]  # its own check refuses a bad value, in one line
    assert result.stderr.strip().splitlines()[-1] == "workbench: error: --probe-share must be in [0, 1]"
    assert "Traceback" not in result.stderr and not (tmp_path / "run-refused").exists()


def test_every_setting_is_declared_once_and_every_surface_takes_it():
    names = [setting.name for setting in SETTINGS]
    assert len(names) == len(set(names))
    request_fields = list(RunRequest.__dataclass_fields__)
    assert request_fields == names
    config, _ = resolve_config(RunRequest("features", out="x"))
    assert list(config.to_dict()) == [setting.stored_name for setting in SETTINGS]  # config.yaml's keys, in order


def _method_options(argv: list[str]) -> dict:
    return resolve_config(adapt_request(parse(argv)))[0].method_options


def test_the_earlier_scaling_flag_gives_the_same_lora_options_with_one_warning_line(capsys):
    argv = ["adapt", "--domain", "ptbxl", "--method", "lora", "--out", "x"]
    with pytest.warns(FutureWarning, match="--scaling was renamed --lora-scaling in 0.1") as caught:
        earlier = _method_options([*argv, "--scaling", "rslora"])
    assert len(caught) == 1
    assert earlier == _method_options([*argv, "--lora-scaling", "rslora"]) and earlier["lora_scaling"] == "rslora"
    with pytest.raises(SystemExit) as exit_:  # on the command line: one warning line, then the run's own refusal
        cli.main([*argv, "--scaling", "rslora", "--epochs", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "workbench: warning: method lora: --scaling was renamed --lora-scaling in 0.1; --scaling stops working in 0.3: "
        "use --lora-scaling",
        "workbench: error: --epochs must be at least 1, got 0",
    ]
    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    flags = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  --")]
    assert "--lora-scaling" in flags and "--scaling" not in flags  # the earlier flag is hidden from --help


def test_on_an_eeg_task_scaling_stays_the_tasks_option():
    assert "scaling" in {option.name for option in tasks.get("sleepedf").options}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = parse(["adapt", "--domain", "sleepedf", "--method", "lora", "--scaling", "zscore", "--out", "x"])
        request = adapt_request(args)
    assert request.task_options == {"scaling": "zscore"} and request.method_options == {}


def test_an_old_config_with_the_earlier_key_still_loads_and_resumes_as_named_now(tmp_path):
    config, _ = resolve_config(RunRequest("ptbxl", method="lora", out=str(tmp_path), method_options={
        "lora_scaling": "rslora"}))  # fmt: skip
    old = config.to_dict()
    old["method_options"] = {("scaling" if k == "lora_scaling" else k): v for k, v in old["method_options"].items()}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    with pytest.warns(FutureWarning, match="config.yaml: method_options: 'scaling' was renamed 'lora_scaling'"):
        loaded = Run.read_config_file(tmp_path)
    assert loaded == config
    with pytest.warns(FutureWarning, match="'scaling' was renamed 'lora_scaling'"):
        check_out_dir(tmp_path, config, resume=True)  # --resume: the same settings, as they are named now
    with pytest.warns(FutureWarning, match="'scaling' was renamed 'lora_scaling'"):  # an old adapter.json's options
        assert methods.get("lora")(scaling="rslora").config == config.method_options
    with pytest.warns(FutureWarning, match="method 'lora': 'scaling' was renamed"):  # and the Python API's options
        assert resolve_config(RunRequest("ptbxl", method="lora", out="x", method_options={"scaling": "rslora"}))[
            0].method_options == config.method_options  # fmt: skip


def test_an_earlier_name_works_for_one_minor_version_after_its_rename():
    renamed = RenamedFrom("scaling", "0.1")
    assert renamed.accepted("0.1.0") and renamed.accepted("0.2.7") and not renamed.accepted("0.3.0")
    assert renamed.removed_in == "0.3"
    plugins = [cls for registry in (methods, tasks) for _, cls in registry.items()]
    declared = [option for cls in plugins for option in cls.options if option.renamed_from]
    declared += [setting for setting in SETTINGS if setting.renamed_from]
    assert declared and all(item.renamed_from.accepted() for item in declared), "a release ended a rename: remove it"


def test_compare_reads_its_entries_with_method_entry_parse(capsys):
    from workbench.comparison.design import entry_of
    from workbench.core.config import MethodEntry

    assert entry_of("full@ecg:frozen") == MethodEntry("full", "ecg", "frozen") and str(entry_of("lora:r4")) == "lora:r4"
    with pytest.raises(SystemExit):
        cli.main(["compare", "--domain", "features", "--methods", "full,war mpot", "--plan", "--sd", "0.1"])
    assert capsys.readouterr().err.strip() == (
        "workbench: error: --methods: 'war mpot' is not METHOD[@MODEL][:VARIANT] (letters, digits, _.+-)"
    )


def test_a_renamed_setting_keeps_its_earlier_flag_key_and_keyword_working(monkeypatch, tmp_path):
    """The same path for a run setting: its declaration says what it was renamed from, and the earlier flag, the
    ``config.yaml`` / ``spec.json`` key and the ``workbench.adapt`` keyword keep working, each with a warning."""
    import dataclasses

    import workbench
    from workbench.comparison.design import CompareSpec
    from workbench.core import config, settings
    from workbench.core.errors import UserError
    from workbench.run import adapting as run

    earlier = RenamedFrom("warmup_fraction", "0.1")
    declared = tuple(dataclasses.replace(s, renamed_from=earlier) if s.name == "warmup_share" else s for s in SETTINGS)
    for module in (settings, config, run):
        monkeypatch.setattr(module, "SETTINGS", declared)
    notice = "--warmup-fraction was renamed --warmup-share in 0.1; --warmup-fraction stops working in 0.3"
    with pytest.warns(FutureWarning, match=notice):
        args = parse(["adapt", "--domain", "features", "--schedule", "linear", "--warmup-fraction", "0.1"])
    assert adapt_request(args).warmup_share == 0.1
    with pytest.warns(FutureWarning, match="--warmup-fraction was renamed"):
        assert _compare_spec(parse(["compare", "--domain", "features", "--methods", "full",
                                    "--warmup-fraction", "0.1"])).warmup_share == 0.1  # fmt: skip
    resolved, _ = resolve_config(RunRequest("features", out=str(tmp_path), schedule="linear", warmup_share=0.1))
    old = resolved.to_dict()
    old["warmup_fraction"] = old.pop("warmup_share")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    with pytest.warns(FutureWarning, match="config.yaml: 'warmup_fraction' was renamed 'warmup_share'"):
        assert Run.read_config_file(tmp_path) == resolved
    with pytest.warns(FutureWarning, match="spec.json: 'warmup_fraction' was renamed 'warmup_share'"):
        spec = CompareSpec.from_dict({"domain": "features", "methods": ["full"], "warmup_fraction": 0.1})
    assert spec.warmup_share == 0.1
    # the keyword reaches the setting (not the task's options): refused by the setting's own check, nothing trained
    with pytest.warns(FutureWarning, match="workbench.adapt: 'warmup_fraction'"):
        with pytest.raises(UserError, match="--warmup-share 0.5 needs --schedule linear"):
            workbench.adapt(domain="features", warmup_fraction=0.5, out=str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()
