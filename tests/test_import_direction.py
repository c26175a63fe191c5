"""Plug-ins import in one direction, and the engine names none of them.

The layers, lowest first: the engine (``workbench/``) ← models (``workbench.models``) ← adaptation methods
(``workbench.adaptation``) ← domains (``workbench.domains``). A module may import its own layer and the layers
below it, never one above (lazy imports inside functions count too); a domain imports another domain only through
that domain's package (``workbench.domains.ecg``, whose ``__init__`` says what it offers), never its modules; and
``import workbench`` imports no optional third-party library. The engine's files name no task, model, method,
domain or model library: everything particular lives in a plug-in.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from workbench.registry import methods, models, tasks

ROOT = Path(__file__).resolve().parents[1]
#: Layer of each folder, lowest first, and the import package it installs as.
LAYERS = {"workbench": 0, "models": 1, "adaptation": 2, "domains": 3}
PACKAGES = {"workbench.models": "models", "workbench.adaptation": "adaptation", "workbench.domains": "domains"}
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
    for folder in ("workbench", "adaptation"):
        (tmp_path / folder).mkdir()
    (tmp_path / "domains" / "two" / "readers.py").write_text("def read(): ...\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(v.split(" (")[0] for v in _violations()) == [
        "domains/one/x.py:1 imports workbench.domains.two.readers",
        "models/bad.py:2 imports workbench.adaptation.lora",
    ]


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
    for path in sorted((ROOT / "workbench").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.strip().startswith("#"):
                continue
            found += [f"{path.name}:{number}: {match.group(0)}" for match in pattern.finditer(line)]
    assert not found, "the engine names plug-ins:\n" + "\n".join(found)
