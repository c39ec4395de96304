"""A layering rule import-linter cannot state: the engine never imports aiohttp's *server* side.

(import-linter refuses sub-packages of external packages; the Gemini backend legitimately uses
aiohttp's client exceptions, because google-genai runs on aiohttp.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiops

ENGINE_SIDE = ("engine", "gates", "prompts")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_engine_side_never_imports_aiohttp_web():
    root = Path(aiops.__file__).parent
    offenders = []
    for pkg in ENGINE_SIDE:
        for path in (root / pkg).rglob("*.py"):
            bad = {n for n in _imports(path) if n == "aiohttp.web" or n.startswith("aiohttp.web.")
                   or n.startswith("aiohttp.web_")}
            if bad:
                offenders.append(f"{path.relative_to(root)}: {sorted(bad)}")
    assert not offenders, offenders
