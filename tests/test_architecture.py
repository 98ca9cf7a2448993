"""The dependency direction of docs/architecture.md, enforced: the layers contract of pyproject.toml
holds (the plugins on top, reached by the core only by name; the algorithms just above the data
model), and every module of the package belongs to a layer.

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
    assert "Contracts: 1 kept, 0 broken." in r.stdout, r.stdout


def test_every_module_is_in_a_layer(mirror: Path) -> None:
    """A module outside every layer would be checked by nothing: each one lives in a layer's folder."""
    code = f"""
import json, grimp
from importlinter import api
graph = grimp.build_graph("flowgrpo", cache_dir=None)
(contract,) = api.read_configuration({str(PYPROJECT)!r})["contracts_options"]
layers = [name.strip() for layer in contract["layers"] for name in layer.split("|")]
print(json.dumps({{"modules": sorted(graph.modules), "layers": layers}}))
"""
    r = run_in(mirror, code)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    modules, layers = set(out["modules"]), out["layers"]
    # the mirror shows the plugins to import-linter (else the plugins' layer would pass unread)
    assert {"flowgrpo.tools.code", "flowgrpo.envs.coding"} <= modules
    assert set(PLUGINS) <= set(layers)
    outside = sorted(
        m for m in modules - {"flowgrpo"} if not any(m == L or m.startswith(L + ".") for L in layers)
    )
    assert not outside, f"put {outside} in the folder of its concern, or add it to a layer in pyproject.toml"


def test_old_trainer_path_warns_and_still_works() -> None:
    """``flowgrpo.trainer`` moved to ``flowgrpo.training.trainer``; the old import keeps working."""
    sys.modules.pop("flowgrpo.trainer", None)
    with pytest.warns(DeprecationWarning, match="flowgrpo.training.trainer"):
        from flowgrpo.trainer import Trainer
    from flowgrpo.training.trainer import Trainer as moved

    assert Trainer is moved
