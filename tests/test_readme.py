"""The documented API is the API: every import, name and call that README.md and the documentation pages
(``docs/**/*.md``) show resolves in a fresh process, every ``workbench ...`` command line they show is accepted by the
parser, and (slow) every Python block runs as written. A shell block marked ``<!-- test: NAME -->`` runs as written
(README.md's clinical block: a run, a served record, the audit log verified against its signed heads, a card); every
other shell block holds only ``workbench`` command lines (parsed) or is in `UNRUN` with the reason. README.md stays
short and keeps the two commands CI runs."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shlex
import shutil
import signal
import socket
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


def _commands(code: str) -> list[tuple[int, list[str]]]:
    """(line offset, words) of every command of a shell block: lines continued with a backslash joined, comments cut,
    split at ``&&`` and at a background ``&``."""
    found, lines, offset = [], code.splitlines(), 0
    while offset < len(lines):
        start, raw = offset, lines[offset]
        while raw.endswith("\\") and offset + 1 < len(lines):
            offset += 1
            raw = raw[:-1] + " " + lines[offset]
        offset += 1
        line = raw.split(" # ")[0].split("  #")[0].strip()
        if line and not line.startswith("#"):
            found += [(start, shlex.split(command)) for command in re.split(r" &&? ", line)]
    return found


def _workbench_argv(words: list[str]) -> list[str] | None:
    """The argv after ``workbench`` of a ``workbench ...``, ``python -m workbench ...`` or ``torchrun ... -m workbench
    ...`` command, else None."""
    if words[:1] == ["workbench"] or words[:3] == ["python", "-m", "workbench"]:
        return words[3:] if words[0] == "python" else words[1:]
    if "-m" in words and "workbench" in words[words.index("-m") :]:  # torchrun ... -m workbench ...
        return words[words.index("workbench", words.index("-m")) + 1 :]
    return None


def _command_lines() -> list[tuple[str, list[str]]]:
    """("page:line", argv after ``workbench``) of every ``workbench ...`` command in the shell blocks."""
    found = []
    for where, code in _blocks("bash"):
        page, start = where.rsplit(":", 1)
        for offset, words in _commands(code):
            argv = _workbench_argv(words)
            if argv is not None:
                found.append((f"{page}:{int(start) + offset}", argv))
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


def _marked_blocks() -> dict[str, tuple[str, str]]:
    """{NAME: ("page:line", code)} of the shell blocks right after a ``<!-- test: NAME ... -->`` line."""
    found = {}
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^<!-- test: ([\w-]+)[^\n]*-->\n```bash\n(.*?)^```", text, flags=re.S | re.M):
            where = f"{page.relative_to(ROOT)}:{text[: match.start(2)].count(chr(10)) + 1}"
            assert match.group(1) not in found, f"{where}: a second block marked {match.group(1)!r}"
            found[match.group(1)] = (where, match.group(2))
    return found


#: The marked shell blocks a test runs as written (a marker without its test fails).
RUN = {"clinical": "test_readme_clinical_block_runs_as_written"}

#: Shell blocks that neither run nor hold only parsed ``workbench`` commands: (page, text found in the block, once on
#: that page): why not run. A new block that is not run, not all ``workbench`` commands and not here fails.
UNRUN = {
    ("README.md", 'pip install -e ".[atomistic]" && workbench adapt --domain rmd17'): "a fresh venv and install; "
    "CI makes its own, and its workbench command is parsed",
    ("README.md", '-m "not slow"'): "the default suite itself: .ci/run runs this line (checked above)",
    ("README.md", "python -m pytest -q -m slow"): "the slow suite itself",
    ("README.md", "mkdocs serve    #"): "a documentation server that runs until stopped (the docs extra)",
    ("docs/clinical.md", 'curl -H "Authorization: Bearer $TOKEN" -o dashboard.html'): "a running server's page; "
    "tests/test_dashboard.py fetches it from a live server, and its workbench command is parsed",
    ("docs/clinical.md", "--audit-heads /mnt/records/"): "a user's run, records and heads disk; the README's clinical "
    "block runs the same steps",
    ("docs/domains/medvl.md", "python benchmarks/medvl_hlora.py"): "a benchmark run (minutes); its workbench "
    "commands are parsed",
    ("docs/domains/physio.md", "python benchmarks/physiopfm.py"): "a benchmark run (minutes); its workbench "
    "commands are parsed",
    ("docs/foundation-potentials.md", ". .venv-sevennet/bin/activate"): "a second venv with SevenNet's own pins",
    ("docs/getting-started.md", 'pip install -e ".[atomistic]" && workbench adapt --domain rmd17'): "the README's "
    "main job: a fresh venv and install",
    ("docs/getting-started.md", '-m "not slow"'): "the README's test command: the default suite itself",
    ("docs/getting-started.md", "python -m pytest -q -m slow"): "the slow suite itself",
    ("docs/gpu.md", 'pip install -e ".[atomistic,cueq-cuda]"'): "needs a CUDA GPU",
}


def test_every_shell_block_is_run_parsed_or_exempted():
    marked = _marked_blocks()
    assert set(marked) == set(RUN) and all(name in globals() for name in RUN.values()), (
        f"marked blocks {sorted(marked)}, run by {RUN}"
    )
    run = {where for where, _ in marked.values()}
    used = dict.fromkeys(UNRUN, 0)
    unclaimed = []
    for where, code in _blocks("bash"):
        exempt = [key for key in UNRUN if where.startswith(key[0] + ":") and key[1] in code]
        for key in exempt:
            used[key] += 1
        parsed = all(_workbench_argv(words) is not None for _, words in _commands(code))
        if where not in run and not parsed and not exempt:
            unclaimed.append(where)
    assert not unclaimed, f"shell blocks neither run (<!-- test: NAME -->), all workbench commands, nor in UNRUN: " \
        f"{unclaimed}"  # fmt: skip
    assert all(count == 1 for count in used.values()), f"UNRUN entries matching no block or several: {used}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_readme_clinical_block_runs_as_written(tmp_path):
    """README.md's clinical block, as a user pastes it at the clone's root: an adapt run, tokens, a server in the
    background, a record uploaded with curl, the server stopped, the audit log verified against its signed heads, a
    card. Run with bash -e in a temporary folder whose ``domains`` is the repository's (the embedded records); the
    install line is checked, not run (this environment has every extra), and port 8000 becomes a free one."""
    for module in ("wfdb", "fastapi", "uvicorn", "multipart"):
        pytest.importorskip(module)
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    where, code = _marked_blocks()["clinical"]
    install, *lines = code.splitlines()
    assert install == 'pip install -e ".[ecg,serve]"', f"{where}: {install}"
    assert {"ecg", "serve"} <= set(importlib.metadata.metadata("sciadapt-workbench").get_all("Provides-Extra"))
    script = "\n".join(lines)
    assert "8000" in script
    script = script.replace("8000", str(_free_port()))
    (tmp_path / "domains").symlink_to(ROOT / "domains")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    log = tmp_path / "output.txt"
    with open(log, "w") as output:  # a file, not a pipe: a server left behind cannot hold the test open
        process = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, env=env,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            returncode = process.wait(timeout=900)
        finally:
            try:  # whatever the block left running (its server, when a step failed)
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = log.read_text()
    assert returncode == 0, f"{where}: exit {returncode}\n{text[-4000:]}"
    assert '"status":"ok"' in text, text[-4000:]
    assert re.search(r"^ok: audit/ecg\.jsonl: 1 line\(s\), hash chain intact", text, flags=re.M), text[-4000:]
    assert re.search(r"^ok: \d+ signed head\(s\) in audit/ecg\.jsonl\.heads\.jsonl held by the log", text,
                     flags=re.M), text[-4000:]  # fmt: skip
    assert (tmp_path / "cards" / "ecg.md").read_text().startswith("# Model card: task `ptbxl`")
