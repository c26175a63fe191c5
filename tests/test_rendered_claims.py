"""The claim tables of the documentation are rendered from benchmarks/results/*.json (`benchmarks/claims.py`), never
typed: every block on every page (``docs/**/*.md``, README.md) equals its results file's rendering, and each block
lives on exactly one page."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _claims():
    spec = importlib.util.spec_from_file_location("benchmark_claims", ROOT / "benchmarks" / "claims.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_page_agrees_with_the_results_files():
    claims = _claims()
    for page in claims.pages():
        text = page.read_text()
        assert claims.render(text) == text, f"{page.relative_to(ROOT)} differs from its results: benchmarks/claims.py"


def test_every_results_file_that_tests_claims_is_on_a_page():
    """A benchmark whose results test claims cannot drop out of the documentation: its block is on a page."""
    claims = _claims()
    shown = {match.group("name") for page in claims.pages() for match in claims.BLOCK.finditer(page.read_text())}
    tested = set()
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        result = json.loads(path.read_text())
        if isinstance(result, dict) and (result.get("claims") or result.get("claim")):
            tested.add(path.stem)
    assert tested, "no results file tests a claim"
    assert tested <= shown, f"results files with claims but no rendered block: {sorted(tested - shown)}"


def test_each_block_is_on_one_page_of_the_docs():
    claims = _claims()
    placed = claims.placed()
    twice = {name: [str(page.relative_to(ROOT)) for page in where] for name, where in placed.items() if len(where) > 1}
    assert not twice, f"blocks rendered on several pages: {twice}"
    outside = [name for name, where in placed.items() if (ROOT / "docs") not in where[0].parents]
    assert not outside, f"blocks outside docs/: {outside}"


def test_check_fails_on_a_block_copied_to_a_second_page(tmp_path, monkeypatch):
    claims = _claims()
    (tmp_path / "docs").mkdir()
    page = next(page for page in claims.pages() if claims.BLOCK.search(page.read_text()))
    block = claims.BLOCK.search(page.read_text()).group(0)
    (tmp_path / "README.md").write_text(block + "\n")
    (tmp_path / "docs" / "page.md").write_text(block + "\n")
    monkeypatch.setattr(claims, "ROOT", tmp_path)  # the pages of a copy: README.md and docs/page.md
    assert claims.main(["--check"]) == 1
    (tmp_path / "README.md").write_text("no block\n")
    assert claims.main(["--check"]) == 0


def test_every_results_file_agrees_with_its_own_cells():
    claims = _claims()
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        if "comparison" in result:  # a comparison's results (speed benchmarks write their own tables)
            again = json.dumps(claims.refreshed(result), sort_keys=True)  # as text: NaN (one unit) equals NaN
            assert again == json.dumps(result, sort_keys=True), f"{path.name}: python benchmarks/claims.py --refresh"


def test_a_changed_result_changes_the_page(tmp_path):
    claims = _claims()
    name, where = next(
        (name, where[0])
        for name, where in claims.placed().items()
        if "comparison" in json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
    )
    text = where.read_text()
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "results")
    path = tmp_path / "results" / f"{name}.json"
    result = json.loads(path.read_text())
    first = next(iter(result["comparison"]["summary"].values()))
    metric = result["table_metrics"][0]
    first["metrics"][metric]["mean"] += 0.1234
    path.write_text(json.dumps(result))
    assert claims.render(text, tmp_path / "results") != text


def test_a_withdrawn_table_keeps_its_numbers_and_shows_no_verdict():
    """A withdrawn benchmark (kept as a record of what ran) prints its differences but no verdict word beside them,
    and lists no claims."""
    claims = _claims()
    result = json.loads((ROOT / "benchmarks" / "results" / "elora_sevennet_n10.json").read_text())
    assert result.get("withdrawn")
    rows = [line for line in claims.rendered(result).splitlines() if line.startswith("| ") and "MDD" in line]
    verdicts = {row.rsplit("(", 1)[1].split(")", 1)[0] for row in rows}
    assert rows and verdicts == {"withdrawn: no verdict"}
    shown = claims.rendered({**result, "withdrawn": ""})  # the same results, not withdrawn: the verdicts come back
    assert "(withdrawn: no verdict)" not in shown and "does not hold" in shown
