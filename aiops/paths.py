"""Where aiops keeps its files: the config and data dirs, the shipped defaults, `.env`.

Apart from aiops.config (pydantic) so that what only needs paths — `aiops chat` through a running
aiops, which looks up the data dir's run file — does not pay for importing pydantic and building
the configuration's models (issue 27). aiops.config re-exports all of it.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("aiops.config")

APP_NAME = "aiops"


class ConfigError(Exception):
    """A configuration problem, already phrased for the operator (file and key named)."""


class DataDirUnusable(Exception):
    """The data dir cannot be created, written or its store opened: one line for the operator
    (exit status 2), not a traceback. Raised where the data dir is first touched (the log file, the
    lock, the store), which a command reaches through the engine as well as directly; here, in the
    module every layer may import, so that the engine can raise it and the CLI catch it."""

    def __init__(self, data_dir: Path, error: BaseException, where: Path | str | None = None) -> None:
        self.data_dir = data_dir
        self.error = error
        # mkdir of a path that is a file says "File exists", which reads as no reason at all.
        reason = "Not a directory" if isinstance(error, FileExistsError) else (
            getattr(error, "strerror", None) or str(error) or type(error).__name__)
        where = where if where is not None else getattr(error, "filename", None)
        # The file inside the data dir that failed (aiops.log, the database), when it is not the dir.
        inside = f" ({where})" if where and Path(where) != Path(data_dir) else ""
        super().__init__(f"data dir {data_dir} is not usable: {reason}{inside}")


REPO_ROOT = Path(__file__).resolve().parent.parent


def _shipped_dir(name: str) -> Path:
    """Where a shipped default dir lives.

    A wheel carries `config/` and `system_prompt/` inside the package as `aiops/_defaults/<name>`
    (pyproject.toml maps them there); a source checkout or an editable install reads the top-level
    dirs of the repository (docs/ARCHITECTURE.md: shipped defaults keep the repository layout).
    """
    # (The package's own directory, not importlib.resources: the same place for a wheel or a
    # checkout, without importing importlib.resources on every run of `aiops`.)
    packaged = Path(__file__).resolve().parent / "_defaults" / name
    if packaged.is_dir():
        return packaged
    return REPO_ROOT / name


SHIPPED_CONFIG_DIR = _shipped_dir("config")
SHIPPED_PROMPT_DIR = _shipped_dir("system_prompt")

# ---- paths ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Paths:
    config_dir: Path
    data_dir: Path
    shipped_config_dir: Path = SHIPPED_CONFIG_DIR
    shipped_prompt_dir: Path = SHIPPED_PROMPT_DIR

    def config_file(self, name: str) -> Path:
        """The user's copy when present, else the shipped default."""
        user = self.config_dir / name
        return user if user.exists() else self.shipped_config_dir / name

    @property
    def db_path(self) -> Path:
        return self.data_dir / "aiops.sqlite3"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "aiops.log"

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "aiops.lock"

    def env_files(self) -> list[Path]:
        return [Path.cwd() / ".env", self.config_dir / ".env"]

    @property
    def prompt_dir(self) -> Path:
        """The user's system-prompt trees; edits (`!prompt edit`, update_system_prompt) land here."""
        return self.config_dir / "system_prompt"

    def prompt_folder(self, name: str) -> Path | None:
        """The tree a `system_prompt_folder` names: `<config dir>/system_prompt/<name>`, or an
        absolute path as given; None for "none". It may not exist yet (see ensure_prompt_folder)."""
        if name.lower() == "none":
            return None
        p = Path(name).expanduser()
        if p.is_absolute():
            return p
        return self.prompt_dir / name

    def shipped_prompt_folder(self, name: str) -> Path | None:
        """The shipped tree a relative `system_prompt_folder` is first copied from, if there is one."""
        if name.lower() == "none" or Path(name).expanduser().is_absolute():
            return None
        src = self.shipped_prompt_dir / name
        return src if src.is_dir() else None

    def ensure_prompt_folder(self, name: str) -> Path | None:
        """prompt_folder(name), first copied from the shipped default when the user has none yet.

        The shipped tree is never used in place: edits would otherwise change the repository or
        site-packages. If the copy cannot be made (a read-only config dir), the shipped tree is
        returned so turns keep their system prompt, and the failure is logged.
        """
        folder = self.prompt_folder(name)
        src = self.shipped_prompt_folder(name)
        if folder is None or src is None or folder.exists():
            return folder
        try:
            copy_tree(src, folder)
        except OSError as e:
            log.warning("cannot copy the default system prompt %s to %s (%s); using it read-only",
                        src, folder, e.strerror or e)
            return src
        return folder


def copy_tree(src: Path, dest: Path) -> None:
    """Copy a directory so `dest` appears complete or not at all (a concurrent copy may win)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    try:
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.is_dir():
            raise


def replace_tree(src: Path, dest: Path) -> None:
    """Replace the directory `dest` with a copy of `src`; `dest` goes only once the copy is whole."""
    staged = dest.parent / f".{dest.name}.new-{os.getpid()}"
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    shutil.rmtree(staged, ignore_errors=True)
    try:
        shutil.copytree(src, staged)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)  # no half copy left beside the user's tree
        raise
    os.rename(dest, old)
    try:
        os.rename(staged, dest)
    except OSError:
        os.rename(old, dest)
        shutil.rmtree(staged, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def resolve_paths(config_dir: str | Path | None = None, data_dir: str | Path | None = None) -> Paths:
    import platformdirs  # deferred: keeps `import aiops.config` cheap

    cfg = config_dir or os.environ.get("AIOPS_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME)
    data = data_dir or os.environ.get("AIOPS_DATA_DIR") or platformdirs.user_data_dir(APP_NAME)
    return Paths(config_dir=Path(cfg).expanduser().resolve(), data_dir=Path(data).expanduser().resolve())


def load_env(paths: Paths) -> None:
    """Secrets come from the environment or a .env file; the environment wins."""
    for p in paths.env_files():
        if p.is_file():
            from dotenv import load_dotenv  # (only with a .env file to read)

            load_dotenv(p, override=False)
