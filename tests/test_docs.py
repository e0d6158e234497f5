"""The documentation stays true: every worked example is run by a test, no test asks for a missing
one, every page is in the site's navigation, and the README's links and install line hold."""

from __future__ import annotations

import ast
import re

from helpers.examples import MARKER, doc_examples, doc_pages
from helpers.paths import REPO

_RUNNERS = {"run_doc_example", "doc_example"}


def _test_files():
    return sorted((REPO / "tests").glob("*.py"))


def _requested_and_mentioned() -> tuple[dict[str, str], set[str]]:
    """Names passed literally to run_doc_example (-> the file), and every string constant of the
    test files that call it (a name may come through a parametrize list)."""
    requested: dict[str, str] = {}
    mentioned: set[str] = set()
    for path in _test_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
                 and getattr(node.func, "id", getattr(node.func, "attr", None)) in _RUNNERS]
        if not calls:
            continue
        for call in calls:
            first = call.args[0] if call.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                requested[first.value] = path.name
        mentioned |= {node.value for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return requested, mentioned


def test_every_marker_is_followed_by_a_bash_block_and_names_are_unique():
    examples = doc_examples()  # asserts uniqueness across README.md and docs/
    markers = [name for page in doc_pages()
               for name in MARKER.findall(page.read_text(encoding="utf-8"))]
    assert sorted(markers) == sorted(examples), "a marker without a ```bash block right after it"
    assert len(markers) == len(set(markers))


def test_every_example_is_run_by_a_test_and_every_requested_example_exists():
    examples = doc_examples()
    requested, mentioned = _requested_and_mentioned()
    assert examples, "no <!-- example: NAME --> in README.md or docs/"
    unrun = sorted(set(examples) - mentioned)
    assert not unrun, f"examples no test runs: {unrun}"
    missing = {name: test for name, test in requested.items() if name not in examples}
    assert not missing, f"tests ask for examples that README.md and docs/ lack: {missing}"


def test_every_docs_page_is_in_the_navigation_and_every_nav_entry_exists():
    nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M))
    pages = {str(path.relative_to(REPO / "docs")) for path in (REPO / "docs").rglob("*.md")}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries without a page"


def test_readme_links_into_the_docs_resolve():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(((?:docs/|ARCHITECTURE)[^)#\s]*)", readme)
    assert targets
    missing = [target for target in targets if not (REPO / target).exists()]
    assert not missing, missing


def test_readme_install_names_every_extra_of_setup_py():
    source = (REPO / "setup.py").read_text(encoding="utf-8")
    extras = set(re.findall(r'^\s*"(\w+)": \[', source, re.M))
    extras |= set(re.findall(r'EXTRAS\["(\w+)"\] =', source))
    assert {"all", "docs", "pyspy"} <= extras
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    missing = sorted(extra for extra in extras if extra != "dev" and f"`{extra}`" not in install)
    assert not missing, f"README's Install section does not name the extras {missing}"
