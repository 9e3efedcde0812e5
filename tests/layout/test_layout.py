"""The package layout of docs/architecture.md: what each package may import, and that imports resolve.

The repository root is quest_ort, every subpackage is packaged, each imports only the packages its
row of the architecture table lists, and every relative import resolves in the source tree.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

import pytest

REPO = next(parent for parent in pathlib.Path(__file__).resolve().parents if (parent / "pyproject.toml").is_file())


def allowed_imports() -> dict[str, set[str]]:
    """package -> the packages it may import, from the table in docs/architecture.md."""
    table = {}
    for line in (REPO / "docs" / "architecture.md").read_text().splitlines():
        row = re.fullmatch(r"\| `(\w+)` \| [^|]+ \| ([^|]+) \|", line.strip())
        if row:
            table[row[1]] = set() if row[2].strip() == "(nothing)" else {p.strip() for p in row[2].split(",")}
    return table


PACKAGES = allowed_imports()


def modules(package: str):
    yield from sorted((REPO / package).rglob("*.py"))


def relative_imports(path: pathlib.Path):
    """(line, target parts) of every relative import in `path`, the target resolved against the tree
    (`from .. import runtime` names the module runtime, `from ..runtime import model` too)."""
    folder = list(path.relative_to(REPO).parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level - 1 > len(folder):
                yield node.lineno, None  # climbs above the repository root
                continue
            base = folder[: len(folder) - (node.level - 1)]
            if node.module:
                yield node.lineno, base + node.module.split(".")
            else:
                yield from ((node.lineno, base + [alias.name]) for alias in node.names)


def test_the_architecture_table_names_every_subpackage_and_pyproject_packages_each():
    folders = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"benchmarks"}
    # (pyproject.toml read as text: tomllib needs Python 3.11, the package 3.10)
    line = next(line for line in (REPO / "pyproject.toml").read_text().splitlines() if line.startswith("wheel.packages"))
    packaged = dict(re.findall(r'"([^"]+)" = "([^"]+)"', line))
    assert set(PACKAGES) == folders, "docs/architecture.md's table and the subpackage folders differ"
    assert packaged == {f"quest_ort/{name}": name for name in folders}, "pyproject.toml's wheel.packages"
    assert (REPO / "__init__.py").is_file() and not (REPO / "quest_ort").exists()


def test_importing_quest_ort_at_the_repository_root_gives_the_installed_package():
    script = "import quest_ort, pathlib; print(pathlib.Path(quest_ort.get_library_path()).is_file())"
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "True", run.stderr


def test_the_root_init_imports_on_its_own_whatever_the_checkouts_folder_is_called():
    """pytest imports the root's __init__.py as a module of its own, named "__init__" when the
    checkout's folder is no identifier (quest-ort, ci.1): it must import the installed package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("__init__", REPO / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert pathlib.Path(module.get_library_path()).is_file()


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_imports_only_what_the_architecture_allows(package):
    wrong = []
    for path in modules(package):
        for line, target in relative_imports(path):
            if target is None:
                wrong.append(f"{path.relative_to(REPO)}:{line} climbs above the package root")
            elif target and target[0] != package and target[0] not in PACKAGES[package]:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {'.'.join(target)}")
    assert not wrong, f"{package} may import {sorted(PACKAGES[package]) or 'nothing'}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_relative_import_resolves_in_the_source_tree(package):
    """What static analysis follows: the module (or package) each relative import names exists."""
    unresolved = []
    for path in modules(package):
        for line, target in relative_imports(path):
            where = REPO.joinpath(*target) if target else REPO
            if target is None or not (where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()):
                unresolved.append(f"{path.relative_to(REPO)}:{line}")
    assert not unresolved, "relative imports that do not resolve: " + ", ".join(unresolved)
