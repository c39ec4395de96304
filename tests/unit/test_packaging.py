"""What a wheel carries: every package, the shipped config and the system-prompt trees, found from
the installed package (not from a source checkout) by `aiops config check` and `aiops config paths`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

from aiops.config import CONFIG_FILES, REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def test_every_package_and_shipped_prompt_tree_is_listed_in_pyproject():
    # The list is explicit (package-dir maps config/ and system_prompt/ into aiops/_defaults/), so a
    # new sub-package or a new shipped prompt tree must be added to it or the wheel lacks it.
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "aiops").rglob("__init__.py")}
    trees = {f"aiops._defaults.system_prompt.{p.name}" for p in (REPO_ROOT / "system_prompt").iterdir() if p.is_dir()}
    assert on_disk | trees | {"aiops._defaults.config"} == listed


def test_the_wheel_carries_the_defaults_and_aiops_finds_them_there(tmp_path):
    # Built from a copy of what the build reads, so no build/ dir lands in the checkout (and a
    # file the build needs but the copy lacks would show up here).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, src / name)
    for name in ("aiops", "config", "system_prompt"):
        shutil.copytree(REPO_ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheel_dir = tmp_path / "wheel"
    # --no-build-isolation: offline, with the setuptools of the test extras.
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(wheel_dir), str(src)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheel_dir.glob("aiops-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    for name in CONFIG_FILES:
        assert f"aiops/_defaults/config/{name}" in names
    for f in (REPO_ROOT / "system_prompt" / "default").iterdir():
        assert f"aiops/_defaults/system_prompt/default/{f.name}" in names
    assert "aiops/tui/app.tcss" in names

    # Run the unpacked wheel, from a directory that is not the checkout, with an empty config dir:
    # every file falls back to the defaults inside the package.
    site = tmp_path / "site"
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("AIOPS_CONFIG_DIR", None)
    env.pop("AIOPS_DATA_DIR", None)
    dirs = ["--config-dir", str(tmp_path / "cfg"), "--data-dir", str(tmp_path / "data")]

    def aiops(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "aiops.cli", *args, *dirs], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path, env=env)

    check = aiops("config", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "configuration is valid" in check.stdout
    assert f"{site / 'aiops' / '_defaults' / 'config' / 'models.toml'}" in check.stdout
    paths = aiops("config", "paths")
    assert paths.returncode == 0, paths.stderr
    assert f"shipped defaults {site / 'aiops' / '_defaults' / 'config'}" in paths.stdout
    assert f"{tmp_path / 'cfg' / 'system_prompt' / 'default'}" in paths.stdout
    assert str(REPO_ROOT / "config") not in paths.stdout
