"""`aiops config paths|check|init` and `aiops mcp import`: the files aiops reads, and writing them."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiops.cli.common import CliError, load


def _lock_state(path: Path) -> str:
    from aiops.engine.lock import fcntl, holder

    if fcntl is None:
        return "no locking on this platform"
    if not path.exists():
        return "absent: no aiops runs on this data dir"
    info = holder(path)
    if info is None:
        return "free: no aiops runs on this data dir"
    url = f", {info['url']}" if info.get("url") else ""
    return f"held by pid {info.get('pid', '?')}{url}"


def cmd_config_paths(args: argparse.Namespace) -> int:
    from aiops.config import CONFIG_FILES, read_toml, resolve_paths

    paths = resolve_paths(args.config_dir, args.data_dir)

    def absent(p: Path, note: str = "absent") -> str:
        return "" if p.exists() else f"  ({note})"

    print(f"config dir       {paths.config_dir}{absent(paths.config_dir)}")
    print(f"shipped defaults {paths.shipped_config_dir}")
    for name in CONFIG_FILES:
        p = paths.config_file(name)
        origin = "user" if p.parent == paths.config_dir else "default"
        print(f"  {name:<14} {p}  ({origin})")
    print(f"data dir         {paths.data_dir}{absent(paths.data_dir)}")
    print(f"  database       {paths.db_path}{absent(paths.db_path)}")
    print(f"  log file       {paths.log_path}{absent(paths.log_path)}")
    print(f"  lock file      {paths.lock_path}  ({_lock_state(paths.lock_path)})")
    # Every tree a model names, where it is read and edited, and where a missing one comes from.
    try:
        models = read_toml(paths.config_file("models.toml")).get("models", {})
        folders = sorted({str(m.get("system_prompt_folder", "default")) for m in models.values()
                          if isinstance(m, dict)} or {"default"})
    except Exception:  # noqa: BLE001 - `config check` reports a broken models.toml
        folders = ["default"]
    print(f"system prompts   {paths.prompt_dir}")
    for name in folders:
        folder = paths.prompt_folder(name)
        if folder is None:
            continue
        src = paths.shipped_prompt_folder(name)
        note = "" if folder.exists() else (f"  (absent: copied from {src} on first use)" if src
                                           else "  (absent)")
        print(f"  {name:<14} {folder}{note}")
    print(f"shipped prompts  {paths.shipped_prompt_dir}")
    envs = [str(p) + ("" if p.exists() else " (absent)") for p in paths.env_files()]
    print(f".env files       {', '.join(envs)}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    cfg = load(args)
    from aiops.prompts.tree import load_tree

    problems = 0
    for name, path in cfg.sources.items():
        print(f"ok  {name:<14} {path}")
    for key, m in cfg.models.models.items():
        if m.enabled and m.key_status() == "missing":
            print(f"warn model {key}: {m.api_key_env} is not set (calls to it will fail)")
    seen: set[Path] = set()
    for key, m in cfg.models.models.items():
        folder = cfg.paths.prompt_folder(m.system_prompt_folder)
        if folder is not None and not folder.exists():
            # Not copied yet: the engine copies the shipped tree on first use; check that one.
            folder = cfg.paths.shipped_prompt_folder(m.system_prompt_folder) or folder
        if folder is None or folder in seen:
            continue
        seen.add(folder)
        if not folder.exists():
            print(f"ERR model {key}: system_prompt_folder {folder} does not exist")
            problems += 1
            continue
        tree = load_tree(folder)
        for e in tree.errors:
            print(f"ERR system prompt {folder}: {e.message}")
            problems += 1
    from aiops.engine.plugins import PluginUnavailable, discover, stray_tables, validate_settings

    found = discover()
    for name, cls in found.items():
        if isinstance(cls, Exception):
            print(f"ERR plugin {name}: cannot load: {cls}")
            problems += 1
            continue
        try:
            validate_settings(cls, cfg.plugin_settings(cls.name), str(cfg.sources["plugins.toml"]))
        except PluginUnavailable as e:
            print(f"ERR {e}")
            problems += 1
    # A table no installed plugin reads is ignored: a misspelled one leaves its plugin off without a
    # word. A warning, not an error: it may be for a plugin installed elsewhere.
    known = set(found) | {cls.name for cls in found.values() if not isinstance(cls, Exception)}
    for table, near in stray_tables(cfg.plugins, known).items():
        guess = f" (did you mean [{near}]?)" if near else ""
        print(f"warn plugins.toml: [{table}] matches no installed plugin{guess}; it is ignored")
    print("configuration is valid" if not problems else f"{problems} problem(s)")
    return 1 if problems else 0


def cmd_config_init(args: argparse.Namespace) -> int:
    import shutil

    from aiops.config import CONFIG_FILES, copy_tree, replace_tree, resolve_paths

    paths = resolve_paths(args.config_dir, args.data_dir)
    try:
        paths.config_dir.mkdir(parents=True, exist_ok=True)
        for name in CONFIG_FILES:
            dest = paths.config_dir / name
            if dest.exists() and not args.force:
                print(f"kept    {dest}")
                continue
            shutil.copyfile(paths.shipped_config_dir / name, dest)
            print(f"wrote   {dest}")
        # The system prompt trees too: the engine reads and edits the user's copy.
        for src in sorted(p for p in paths.shipped_prompt_dir.iterdir() if p.is_dir()):
            dest = paths.prompt_dir / src.name
            if dest.exists() and not args.force:
                print(f"kept    {dest}/")
                continue
            if dest.exists():
                replace_tree(src, dest)  # the user's tree goes only once the new copy is complete
            else:
                copy_tree(src, dest)
            print(f"wrote   {dest}/")
    except OSError as e:
        raise CliError(f"cannot write {e.filename or paths.config_dir}: {e.strerror or e}") from None
    return 0


def cmd_mcp_import(args: argparse.Namespace) -> int:
    from aiops.config import resolve_paths
    from aiops.mcp_config import import_claude_desktop

    target = resolve_paths(args.config_dir, args.data_dir).config_dir / "mcp.toml"
    try:
        lines = import_claude_desktop(Path(args.file), target, replace=args.replace)
    except ValueError as e:
        raise CliError(str(e)) from None
    print("\n".join(lines + [f"wrote    {target}"]))
    return 0
