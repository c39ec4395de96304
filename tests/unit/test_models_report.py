"""`aiops models`: the registry as an operator reads it, delegation targets included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiops.cli import main
from tests.fakes.fixtures import make_config_dir

MODELS = {
    "main": {"type": "openai", "model_id": "gpt-main", "base_url": "http://127.0.0.1:9/v1"},
    "cleaner": {"type": "openai", "model_id": "small-cleaner", "base_url": "http://127.0.0.1:9/v1",
                "delegation": True, "delegation_timeout": 45},
}


def _models(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    cfg = make_config_dir(tmp_path, MODELS, "main")
    assert main(["--config-dir", str(cfg), "--data-dir", str(tmp_path / "data"), "models", *extra]) == 0
    return capsys.readouterr().out


def test_the_listing_says_which_models_are_delegation_targets_and_their_timeout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _models(tmp_path, capsys)
    header, *rows = out.splitlines()
    assert "delegation" in header.split()
    cleaner = next(r for r in rows if "cleaner" in r.split())
    main_row = next(r for r in rows if "main" in r.split())
    assert "yes 45s" in cleaner
    # Column-aligned: the delegation value sits under its header, the address after it.
    col = header.index("delegation")
    assert cleaner[col:].startswith("yes 45s") and main_row[col:].startswith("no ")
    assert main_row.rstrip().endswith("http://127.0.0.1:9/v1")


def test_the_json_listing_carries_delegation_and_its_timeout(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    rows = {m["key"]: m for m in json.loads(_models(tmp_path, capsys, "--json"))}
    assert (rows["cleaner"]["delegation"], rows["cleaner"]["delegation_timeout"]) == (True, 45)
    assert (rows["main"]["delegation"], rows["main"]["delegation_timeout"]) == (False, 60)
