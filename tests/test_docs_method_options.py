"""The MkDocs hook that renders a method's options into its docs page (docs/hooks/method_options.py)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mkdocs.exceptions import PluginError  # the "test" extra installs mkdocs

from workbench.core.registry import methods

HOOK = Path(__file__).resolve().parents[1] / "docs" / "hooks" / "method_options.py"


def load_hook():
    spec = importlib.util.spec_from_file_location("method_options", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lora_table_lists_every_option_the_method_declares():
    hook = load_hook()
    lora = methods.get("lora")
    rendered = hook.render_markers("before\n\n<!-- options: lora -->\n\nafter", "methods/lora.md")
    assert "<!-- options" not in rendered and rendered.startswith("before") and rendered.endswith("after")
    rows = [line for line in rendered.splitlines() if line.startswith("| `--")]
    assert [re.match(r"\| `(--[\w-]+)`", row).group(1) for row in rows] == [option.flag for option in lora.options]
    assert f"`{lora.learning_rate:g}`" in rendered
    reparam = next(row for row in rows if row.startswith("| `--reparam`"))
    assert "`replora` only with --init kaiming and no --dora." in reparam  # Option.requires, in flags


def test_an_unknown_method_fails_naming_the_page_and_the_marker():
    with pytest.raises(PluginError, match=r"methods/x\.md: <!-- options: lorra -->: unknown method 'lorra' \(did you"):
        load_hook().render_markers("text <!-- options: lorra --> text", "methods/x.md")


def test_a_strict_build_renders_each_option_as_one_table_row(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Methods\n\n<!-- options: lora -->\n\n<!-- options: warmpot -->\n")
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\ndocs_dir: docs\nsite_dir: site\ntheme: mkdocs\nhooks: [{HOOK}]\nmarkdown_extensions: [tables]\n"
    )
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q"], cwd=tmp_path, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    rows = re.findall(r"<tr>\s*<td><code>--.*?</tr>", html, flags=re.S)
    declared = methods.get("lora").options + methods.get("warmpot").options
    assert len(rows) == len(declared)
    assert all(row.count("<td") == 5 for row in rows)  # no help text broke a row
    assert "η2: weight of the label term −log p_t[y_s] in the cost" in html  # escaped markup shown as written
