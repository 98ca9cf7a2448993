"""The dependency direction of the design document, enforced: the import-linter contracts of
pyproject.toml (the core never imports the plugins; advantages and loss import nothing else from
flowgrpo) hold, and every core module is under the first one.

In the source tree the plugins live in tools/ and envs/ and are mapped into the package by
setuptools' package-dir; import-linter reads the files under the package's directory, where they
are not. So the contracts are checked on a mirror of the installed layout: a flowgrpo/ of links to
the working tree's files with tools/ and envs/ inside it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PLUGINS = ("flowgrpo.tools", "flowgrpo.envs")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose flowgrpo/ is the package as installed, made of links to the working tree."""
    root = tmp_path_factory.mktemp("layout")
    pkg = root / "flowgrpo"
    pkg.mkdir()
    for entry in package_dir("flowgrpo").iterdir():
        if entry.name not in ("tools", "envs", "__pycache__"):
            (pkg / entry.name).symlink_to(entry)
    for plugin in PLUGINS:
        (pkg / plugin.split(".")[-1]).symlink_to(package_dir(plugin))
    return root


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations)))


def run_in(mirror: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Python ``code`` run where ``import flowgrpo`` finds the mirror (never the editable install)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=mirror,
        env={"PYTHONPATH": str(mirror), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_import_contracts_hold(mirror: Path) -> None:
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True, no_logo=True))"
    )
    r = run_in(mirror, code)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 2 kept, 0 broken." in r.stdout, r.stdout


def test_every_core_module_is_checked(mirror: Path) -> None:
    """The first contract names the core modules; a new module must be added to it."""
    code = f"""
import json, grimp
from importlinter import api
graph = grimp.build_graph("flowgrpo", cache_dir=None)
(contract,) = [c for c in api.read_configuration({str(PYPROJECT)!r})["contracts_options"]
               if c["name"] == "the core never imports the plugins"]
covered = set()
for expr in contract["source_modules"]:
    covered |= graph.find_matching_modules(expr) if "*" in expr else {{expr}}
print(json.dumps({{"modules": sorted(graph.modules), "covered": sorted(covered)}}))
"""
    r = run_in(mirror, code)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    modules, covered = set(out["modules"]), set(out["covered"])
    # the mirror shows the plugins to import-linter (else the first contract would pass unread)
    assert {"flowgrpo.tools.code", "flowgrpo.envs.coding"} <= modules
    core = {m for m in modules if not any(m == p or m.startswith(p + ".") for p in PLUGINS)}
    missing = sorted(core - covered)
    assert not missing, (
        f"add {missing} to source_modules of 'the core never imports the plugins' in pyproject.toml"
    )
    assert not covered & (modules - core), "a plugin is listed as a core module"
