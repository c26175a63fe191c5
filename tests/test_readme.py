"""The documented API is the API: every import, name and call that README.md and the documentation pages
(``docs/**/*.md``) show resolves in a fresh process, every ``workbench ...`` command line they show is accepted by the
parser, and (slow) every Python block runs as written. README.md stays short and keeps the two commands CI runs."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _blocks(language: str) -> list[tuple[str, str]]:
    """("page:line", code) of every fenced block of ``language`` in README.md and the documentation pages."""
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [
            (f"{page.relative_to(ROOT)}:{text[: match.start()].count(chr(10)) + 2}", match.group(1))
            for match in re.finditer(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)
        ]
    return found


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _resolve_script(code: str) -> str:
    """A script that runs the block's imports, then looks up every dotted name rooted at an imported name and binds
    every call of one to its signature (keyword names checked, nothing run)."""
    tree = ast.parse(code)
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    imported = {alias.asname or alias.name.split(".")[0] for node in imports for alias in node.names}
    lines = [ast.unparse(node) for node in imports] + [
        "import inspect",
        "def bind(function, *args, **kwargs):  # the workbench's own calls: their argument names are checked",
        "    if getattr(function, '__module__', '').startswith('workbench'):",
        "        inspect.signature(function).bind(*args, **kwargs)",
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name and name.split(".")[0] in imported:
                positional = ", ".join("None" for _ in node.args)
                keywords = ", ".join(f"{k.arg}=None" for k in node.keywords if k.arg)
                lines.append(f"bind({name}, {positional}{', ' if positional and keywords else ''}{keywords})")
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name and name.split(".")[0] in imported:
                lines.append(name)
    return "\n".join(lines)


PYTHON_BLOCKS = _blocks("python")


def test_docs_have_python_and_shell_blocks():
    assert len(PYTHON_BLOCKS) >= 3 and len(_blocks("bash")) >= 10


def test_readme_is_short_and_keeps_the_command_ci_runs():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    ci = (ROOT / ".ci" / "run").read_text().split("# --- the README's test command, exactly ---\n")[1].splitlines()[0]
    assert ci in text, f"README.md no longer shows .ci/run's test command: {ci}"
    assert 'pip install -e ".[atomistic]" && workbench adapt --domain rmd17\n' in text  # the main job


@pytest.mark.parametrize("where, code", PYTHON_BLOCKS, ids=[where for where, _ in PYTHON_BLOCKS])
def test_python_block_names_resolve_in_a_fresh_process(where, code):
    script = _resolve_script(code)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, f"{where}:\n{script}\n{result.stderr[-2000:]}"


def _command_lines() -> list[tuple[str, list[str]]]:
    """("page:line", argv after ``workbench``) of every ``workbench ...`` line in the shell blocks."""
    found = []
    for where, code in _blocks("bash"):
        page, start = where.rsplit(":", 1)
        for offset, raw in enumerate(code.splitlines()):
            at = f"{page}:{int(start) + offset}"
            line = raw.split(" # ")[0].split("  #")[0].strip()
            for command in line.split(" && "):
                words = shlex.split(command)
                if words[:1] == ["workbench"] or words[:3] == ["python", "-m", "workbench"]:
                    found.append((at, words[3:] if words[0] == "python" else words[1:]))
                elif "-m" in words and "workbench" in words:  # torchrun ... -m workbench ...
                    found.append((at, words[words.index("workbench", words.index("-m")) + 1 :]))
    return found


def test_every_documented_command_line_parses():
    lines = _command_lines()
    assert len(lines) >= 20
    parser = build_parser()
    for where, argv in lines:
        if "·" in argv:  # a line listing several commands: "workbench data info X · workbench data check X ..."
            continue
        try:
            parser.parse_args(argv)
        except SystemExit as error:
            raise AssertionError(f"{where}: workbench {' '.join(argv)} is refused") from error


@pytest.mark.slow
@pytest.mark.parametrize("where, code", PYTHON_BLOCKS, ids=[where for where, _ in PYTHON_BLOCKS])
def test_python_block_runs_as_written(where, code, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=tmp_path, timeout=1800
    )
    assert result.returncode == 0, f"{where}:\n{result.stderr[-3000:]}"
