"""Imports go one way, and the engine names no plug-in.

The layers, lowest first: the engine's core (``workbench/core``) ← models (``workbench.models``) ← adaptation
methods (``workbench.adaptation``) ← domains (``workbench.domains``); plug-ins import no engine floor but the core.
The engine's floors, lowest first: ``core`` ← ``clinical`` ← ``run`` ← {``comparison``, ``serve``} ← ``cli``; a
floor imports its own and lower floors, never a higher one or a sibling. A module may import its own layer and the
layers below it, never one above (lazy imports inside functions count too); a domain imports another domain only
through that domain's package (``workbench.domains.ecg``, whose ``__init__`` says what it offers), never its modules;
no two engine modules import each other at module level, directly or through others; and ``import workbench``
imports no optional third-party library. No file of the engine, in any sub-folder, names a task, model, method,
domain or model library: everything particular lives in a plug-in.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from workbench.core.registry import methods, models, tasks

ROOT = Path(__file__).resolve().parents[1]
#: Layer of each folder, lowest first, and the import package it installs as.
LAYERS = {"workbench": 0, "models": 1, "adaptation": 2, "domains": 3}
PACKAGES = {"workbench.models": "models", "workbench.adaptation": "adaptation", "workbench.domains": "domains"}
#: Floors of the engine (folders of ``workbench/``), lowest first; floors of one rank may not import each other.
FLOORS = {"core": 0, "clinical": 1, "run": 2, "comparison": 3, "serve": 3, "cli": 4}
#: The engine's top-level files: the package (its public names and old paths, by name only), ``python -m``.
TOP_FILES = {"__init__.py": None, "_moved.py": None, "_forward.py": None, "__main__.py": "cli"}
#: Imports against the layers that are allowed, and why: the engine's package imports ``workbench.models``'s
#: ``__init__`` (which imports no model library) for the import hooks that make those libraries import safely.
ALLOWED = {("workbench/__init__.py", "workbench.models")}
#: Modules of ``domains/`` that every domain shares.
COMMON = {"signal", "splits", "plots"}
#: What ``import workbench`` may import besides the standard library: the core dependencies (pyproject.toml) and
#: what they import.
CORE = {"torch", "numpy", "yaml", "safetensors", "tqdm", "matplotlib", "filelock", "workbench", "PIL", "cycler",
        "dateutil", "fontTools", "kiwisolver", "mpl_toolkits", "packaging", "pyparsing", "six", "typing_extensions",
        "torchgen", "opt_einsum", "sympy", "mpmath", "jinja2", "markupsafe", "networkx", "fsspec",
        "cython_runtime"}  # fmt: skip
#: Words of domains and model libraries (besides every registered task, model and method name) the engine must not
#: use.
DOMAIN_WORDS = ("mace", "e3nn", "cuequivariance", "molecule", "ecg", "leads?", "eeg", "sleep", "graph", "atoms?",
                "homophily", "braindecode", "mne", "wfdb", "peft", "transformers", "torch_geometric", "neurokit2",
                "pyscf", "tblite", "lora", "vqa")  # fmt: skip
#: Registered names that are also the engine's own vocabulary.
GENERIC = {"features", "full"}


def _floor_of(module: str) -> str | None:
    """The engine floor an import of ``module`` lands in (None: not an engine floor: a plug-in, or the package)."""
    parts = module.split(".")
    if parts[0] != "workbench" or len(parts) < 2 or _layer_of(module) != "workbench":
        return None
    return parts[1] if parts[1] in FLOORS else None


def _floor_of_file(path: Path) -> str | None:
    """The engine floor of a file under ``workbench/`` (None: a top-level file importing by name only)."""
    relative = path.relative_to(ROOT / "workbench").parts
    return relative[0] if len(relative) > 1 else TOP_FILES.get(relative[0], "?")


def _layer_of(module: str) -> str | None:
    """The folder an import of ``module`` lands in (None: not the workbench's)."""
    if module != "workbench" and not module.startswith("workbench."):
        return None
    for package, folder in PACKAGES.items():
        if module == package or module.startswith(package + "."):
            return folder
    return "workbench"


def _is_module(module: str) -> bool:
    """Whether ``module`` (``workbench.domains.ecg.readers``) is a module or package of this project."""
    folder = {"workbench": "workbench", **PACKAGES}
    for package in sorted(folder, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            path = ROOT / folder[package] / Path(*module[len(package) + 1 :].split(".") if module != package else ())
            return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or path.is_dir()
    return False


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``, those inside functions included (``from A import b``
    counts ``A``, and ``A.b`` when ``b`` is a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name) for name in names if _is_module(name)]
    return found


def _violations() -> list[str]:
    bad = []
    for folder, layer in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            own = path.relative_to(ROOT / folder).parts
            for line, module in _imports(path):
                target = _layer_of(module)
                where = f"{path.relative_to(ROOT)}:{line} imports {module}"
                if (str(path.relative_to(ROOT)), module) in ALLOWED:
                    continue
                floor = _floor_of(module)
                if folder != "workbench" and floor not in (None, "core"):
                    bad.append(f"{where} (a plug-in imports the engine's {floor} floor, not workbench.core)")
                if folder == "workbench" and floor is not None:
                    mine = _floor_of_file(path)
                    if mine == "?" or (mine is not None and floor != mine and FLOORS[floor] >= FLOORS[mine]):
                        bad.append(f"{where} (floor {floor} is not below {mine})")
                if target is not None and LAYERS[target] > layer and not (folder == "domains" and module ==
                                                                           "workbench.domains"):  # fmt: skip
                    bad.append(f"{where} (layer {target} above {folder})")
                if folder == "domains" and target == "domains" and len(own) > 1:
                    parts = module.split(".")
                    other = parts[2] if len(parts) > 2 else None
                    if other not in (None, own[0], *COMMON) and len(parts) > 3 and (ROOT / "domains" / other).is_dir():
                        bad.append(f"{where} (another domain's module; import its package)")
    return bad


def test_imports_go_one_way():
    assert not _violations(), "imports against the direction:\n" + "\n".join(_violations())


def test_the_check_finds_an_import_against_the_direction(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "bad.py").write_text("def f():\n    from workbench.adaptation.lora import apply\n")
    (tmp_path / "domains" / "one").mkdir(parents=True)
    (tmp_path / "domains" / "two").mkdir()
    (tmp_path / "domains" / "one" / "x.py").write_text("from workbench.domains.two.readers import read\n")
    (tmp_path / "domains" / "one" / "y.py").write_text("from workbench.domains.two import read\n")  # allowed
    for folder in ("workbench/run", "workbench/comparison", "workbench/core", "adaptation"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "domains" / "two" / "readers.py").write_text("def read(): ...\n")
    (tmp_path / "adaptation" / "teacher.py").write_text("def f():\n    from workbench.run.adapting import adapt\n")
    (tmp_path / "adaptation" / "fine.py").write_text("from workbench.core.task import Task\n")  # allowed
    (tmp_path / "workbench" / "core" / "up.py").write_text("from workbench.comparison.design import CompareSpec\n")
    (tmp_path / "workbench" / "comparison" / "down.py").write_text("from workbench.run.adapting import adapt\n")
    (tmp_path / "workbench" / "run" / "sideways.py").write_text("import workbench.serve.app\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(v.split(" (")[0] for v in _violations()) == [
        "adaptation/teacher.py:2 imports workbench.run.adapting",
        "domains/one/x.py:1 imports workbench.domains.two.readers",
        "models/bad.py:2 imports workbench.adaptation.lora",
        "workbench/core/up.py:1 imports workbench.comparison.design",
        "workbench/run/sideways.py:1 imports workbench.serve.app",
    ]


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path) -> set[str]:
    """The engine modules ``path`` imports when it is imported (statements at module level, outside
    ``if TYPE_CHECKING``): ``from A import b`` counts ``A.b`` when it is a module, else ``A``."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            if isinstance(inner, ast.Import):
                found |= {alias.name for alias in inner.names}
            elif isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                names = [f"{inner.module}.{alias.name}" for alias in inner.names]
                found |= {name for name in names if _is_module(name)} or {inner.module}
    return {module for module in found if _floor_of(module) is not None or module == "workbench"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _engine_graph() -> dict[str, set[str]]:
    return {_module_of(path): _module_level_imports(path) for path in sorted((ROOT / "workbench").rglob("*.py"))}


def test_no_import_cycle_in_the_engine():
    assert not _cycles(_engine_graph()), f"import cycles at module level: {_cycles(_engine_graph())}"


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


#: Longest engine file and function [lines]: a file past this holds two things; a function, several steps.
MOST_FILE_LINES = 600
MOST_FUNCTION_LINES = 80


def test_no_engine_file_or_function_is_too_long():
    long = []
    for path in sorted((ROOT / "workbench").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MOST_FILE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MOST_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, f"over {MOST_FILE_LINES} lines a file or {MOST_FUNCTION_LINES} a function:\n" + "\n".join(long)


def test_import_workbench_imports_no_optional_library():
    code = "import sys, workbench; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(run.stdout.split())
    extra = sorted(m for m in loaded - CORE - set(sys.stdlib_module_names) if not m.startswith("_"))
    assert not extra, f"import workbench imports {extra}"


def test_no_engine_file_names_a_domain_model_method_or_library():
    names = [n for n in (*tasks.names(), *models.names(), *methods.names()) if n not in GENERIC]
    pattern = re.compile(r"\b(" + "|".join([*map(re.escape, names), *DOMAIN_WORDS]) + r")\b", re.I)
    found = []
    for path in sorted((ROOT / "workbench").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip().startswith("#"):
                continue
            where = path.relative_to(ROOT / "workbench")
            found += [f"{where}:{number}: {match.group(0)}" for match in pattern.finditer(line)]
    assert not found, "the engine names plug-ins:\n" + "\n".join(found)
