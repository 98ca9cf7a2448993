"""The installed layout: tools/ and envs/ ship as flowgrpo.tools / flowgrpo.envs, never top-level."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("flowgrpo-*.whl")
    return whl


def test_wheel_maps_tools_and_envs_under_flowgrpo(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "flowgrpo/tools/__init__.py" in names
    assert "flowgrpo/envs/__init__.py" in names
    assert not any(n.startswith(("tools/", "envs/", "tests/")) for n in names), names
    entry_points = (
        zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    )
    assert "[flowgrpo.envs]" in entry_points and "[console_scripts]" in entry_points


def test_non_editable_install_imports_from_outside_the_repo(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import flowgrpo, flowgrpo.tools, flowgrpo.envs; print(flowgrpo.tools.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(target)), out.stdout
