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


def _engine_imports(path: Path, modules: set[str]) -> set[str]:
    """The aiops.engine modules `path` imports when it runs (imports under TYPE_CHECKING are
    for the type checker only, and are left out)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(sub) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for sub in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in modules else node.module)
    return found & modules


def test_no_import_circle_inside_the_engine():
    root = Path(aiops.__file__).parent
    paths = {}
    for path in (root / "engine").rglob("*.py"):
        parts = ("aiops", *path.relative_to(root).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        paths[name] = path
    graph = {name: _engine_imports(path, set(paths)) - {name} for name, path in paths.items()}
    circles = []

    def visit(name: str, trail: list[str]) -> None:
        for dep in sorted(graph[name]):
            if dep in trail:
                circles.append(trail[trail.index(dep):] + [dep])
            elif dep not in done:
                visit(dep, [*trail, dep])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not circles, [" -> ".join(c) for c in circles]
