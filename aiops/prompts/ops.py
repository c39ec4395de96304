"""Reading and editing one section of a prompt folder.

Every edit re-reads the folder (never a cached tree), changes exactly one part of one file (plus
the parent's `[SECTIONS]` list for create and remove) and writes atomically: a temp file in the
same folder, fsync, `os.replace`. A crash or a failed write leaves the old file whole. Refusals
raise `PromptEditError` with a message the model or the operator can act on.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
import tempfile
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiops.prompts.tree import (
    MARKER,
    NAME_RE,
    ROOT,
    ROOT_FILE,
    PromptEditError,
    PromptTree,
    Section,
    SectionFile,
    load_tree,
    section_path,
)

TEXT_OPERATIONS = ("append", "prepend", "replace", "delete_lines", "overwrite")
OPERATIONS = (*TEXT_OPERATIONS, "create", "remove")


class ConfirmationRequired(PromptEditError):
    """An overwrite without its confirm flag. The caller says how to confirm: the model sets
    `confirm=true`, the operator adds `--confirm`, so the wording belongs to them."""

    def __init__(self, section: str) -> None:
        super().__init__(f"overwrite replaces all of section '{section}' and needs an explicit confirmation")
        self.section = section


@dataclass(frozen=True)
class FileChange:
    path: Path
    before: str  # "" when the file is created
    after: str  # "" when the file is deleted

    @property
    def diff(self) -> str:
        return _unified_diff(self.path, self.before, self.after)


@dataclass(frozen=True)
class EditResult:
    operation: str
    section: str
    path: Path  # the section's own file
    before: str  # whole file text; "" for create
    after: str  # whole file text; "" for remove
    parent_change: FileChange | None = None  # create and remove also rewrite the parent's list

    @property
    def changed(self) -> bool:
        return self.before != self.after

    @property
    def diff(self) -> str:
        """A unified diff of every file the edit touched, for the audit log."""
        parts = [_unified_diff(self.path, self.before, self.after)]
        if self.parent_change is not None:
            parts.append(self.parent_change.diff)
        return "".join(parts)

    @property
    def summary(self) -> str:
        if not self.changed:
            return f"{self.operation}: section '{self.section}' unchanged"
        added = removed = 0
        for line in self.diff.splitlines():
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        return f"{self.operation}: section '{self.section}' ({self.path.name}), +{added} -{removed} lines"


def _unified_diff(path: Path, before: str, after: str) -> str:
    def lines(text: str) -> list[str]:
        # A last line without a newline would otherwise run into the next hunk line.
        return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(keepends=True)]

    return "".join(difflib.unified_diff(lines(before), lines(after), f"a/{path.name}", f"b/{path.name}"))


def read_section(tree: PromptTree, ref: str | int = "", tools: Collection[str] | None = None) -> str:
    """The whole assembled prompt (`ref` empty), or one section as it appears in the prompt.

    A container is shown with its descendants, because that is what it contributes to the prompt.
    With `tools` (the registered tool names), sections whose `[REQUIRES ...]` is not met are left
    out like in the prompt, and a note says so; asking for such a section by name shows its text
    under a note that it is inactive.
    """
    if isinstance(ref, str) and not ref.strip():
        return tree.assemble(tools)
    section = tree.find(ref)
    subtree = tree.subtree(section)
    missing = tree.missing_tools(section, tools)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        note = (f"(inactive: section '{section.name}' is left out of the prompt: "
                f"{_tool_list(missing)} {verb} not available)")
        return note + "\n" + PromptTree(tree.folder, "", tuple(subtree), ()).assemble()
    shown = tuple(s for s in subtree if not tree.missing_tools(s, tools))
    text = PromptTree(tree.folder, "", shown, ()).assemble()
    left_out = [f"{s.name} (needs {_tool_list(tree.missing_tools(s, tools))})"
                for s in subtree if s not in shown]
    if left_out:
        text += f"\n\n(not part of the prompt: {', '.join(left_out)})"
    return text


def _tool_list(tools: Sequence[str]) -> str:
    return "tool " + tools[0] if len(tools) == 1 else "tools " + ", ".join(tools)


NAME_MAX = 64  # a section's file name holds it: far below any file system's limit


def edit_section(
    folder: Path,
    ref: str | int,
    operation: str,
    content: str = "",
    target: str = "",
    confirm: bool = False,
    description: str = "",
    parent: str | int = "",
) -> EditResult:
    """Apply one operation to one section of the prompt in `folder`.

    `ref` names the section (name or 1-based index); for `create` it is the new section's name and
    `parent` names the container to put it under ("" or "root" for the root).
    """
    op = operation.strip().lower().replace("-", "_")
    if op not in OPERATIONS:
        raise PromptEditError(f"unknown operation '{operation}'; operations: {', '.join(OPERATIONS)}")
    folder = Path(folder)
    try:
        with _folder_lock(folder):
            tree = load_tree(folder)
            if op == "create":
                return _create(tree, str(ref).strip(), parent, content, description)
            section = tree.find(ref)
            if op == "remove":
                return _remove(tree, section)
            return _edit_text(section, op, content, target, confirm)
    except OSError as e:
        # Said without the folder's path: the model reads this, and the data dir is not its business.
        name = f" ({Path(e.filename).name})" if e.filename else ""
        raise PromptEditError(f"the edit failed: {e.strerror or type(e).__name__}{name}") from None


# ---- text operations ------------------------------------------------------------------------------


def _edit_text(section: Section, op: str, content: str, target: str, confirm: bool) -> EditResult:
    name = section.name
    if section.is_container:
        children = ", ".join(section.children) or "(none yet)"
        raise PromptEditError(f"section '{name}' is a container and cannot be edited as text; "
                              f"edit one of its children instead: {children}")
    before = _read(section.path)
    parsed = SectionFile.parse(before)
    body = parsed.body
    if op in ("append", "prepend", "overwrite") and not content.strip():
        hint = "; use remove to delete the section" if op == "overwrite" else ""
        raise PromptEditError(f"{op} needs content{hint}")
    if op in ("replace", "delete_lines") and not target:
        raise PromptEditError(f"{op} needs a target text from section '{name}'")
    _check_content(content)

    if op == "append":
        new_body = _join(body, content)
    elif op == "prepend":
        new_body = _join(content, body)
    elif op == "replace":
        if target not in body:
            raise PromptEditError(f"target text not found in section '{name}'; it must match exactly, "
                                  "including spaces and line breaks (read the section first)")
        new_body = body.replace(target, content, 1)
    elif op == "delete_lines":
        lines = body.splitlines(keepends=True)
        kept = [line for line in lines if target not in line]
        if len(kept) == len(lines):
            raise PromptEditError(f"no line in section '{name}' contains the target text")
        new_body = "".join(kept)
    else:  # overwrite
        if not confirm:
            raise ConfirmationRequired(name)
        new_body = content.rstrip("\n") + "\n"

    after = parsed.with_body(new_body).render()
    if after != before:
        _write(section.path, after)
    return EditResult(op, name, section.path, before, after)


def _join(first: str, second: str) -> str:
    first, second = first.rstrip("\n"), second.rstrip("\n")
    if not first.strip():
        return second + "\n"
    if not second.strip():
        return first + "\n"
    return f"{first}\n{second}\n"


def _check_content(content: str) -> None:
    if any(line.strip() == MARKER for line in content.splitlines()):
        # It would silently turn a leaf into a container of whatever follows.
        raise PromptEditError(f"content may not contain a {MARKER} line; use create to add sections")


# ---- create and remove ----------------------------------------------------------------------------


def _create(tree: PromptTree, name: str, parent_ref: str | int, content: str, description: str) -> EditResult:
    if len(name) > NAME_MAX:
        raise PromptEditError(f"section name too long ({len(name)} characters; at most {NAME_MAX})")
    if not NAME_RE.fullmatch(name):
        raise PromptEditError(f"invalid section name '{name}'; use letters, digits, '_' or '-'")
    if name.isdigit():
        raise PromptEditError(f"section name '{name}' is all digits and would read as an index; add a letter")
    if name in tree.names:
        raise PromptEditError(f"section '{name}' already exists; choose another name")
    for error in tree.errors:
        if error.name == name and error.kind != "invalid":
            raise PromptEditError(f"section '{name}' is already listed ({error.message}); choose another name")
    path = section_path(tree.folder, name)
    if path.exists():
        raise PromptEditError(f"file {path.name} already exists in {tree.folder} though no list names it; "
                              "choose another name or ask the operator to delete the file")
    description = description.strip()
    # splitlines, as the list is read back: a "\r", "\x85" or "\u2028" would end the entry there
    # and start another, naming (and taking over) any section.
    if not description or len(description.splitlines()) > 1 or not description.isprintable():
        raise PromptEditError("create needs a one-line description of printable characters; it is "
                              "shown as 'name: description'")
    _check_content(content)

    parent_path = _parent_path_for_create(tree, parent_ref)
    parent_before = _read(parent_path, missing_ok=parent_path.name == ROOT_FILE)
    parent_after = _add_entry(parent_before, f"{name}: {description}")
    after = content.rstrip("\n") + "\n" if content.strip() else ""
    parsed = SectionFile.parse(after)
    if parsed.heading is not None or parsed.requires is not None:
        # The content is the body: a leading `## ` or `[REQUIRES ...]` line stays content rather
        # than becoming the file's title or condition.
        after = "\n" + after

    _write(path, after)
    try:
        _write(parent_path, parent_after)
    except PromptEditError:
        # Without the list entry the new file is an orphan that would block the name.
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return EditResult("create", name, path, "", after, FileChange(parent_path, parent_before, parent_after))


def _parent_path_for_create(tree: PromptTree, parent_ref: str | int) -> Path:
    if isinstance(parent_ref, str):
        word = parent_ref.strip()
        # "root" means the root unless someone really named a section that.
        if not word or (word == ROOT and ROOT not in tree.names):
            return tree.folder / ROOT_FILE
    parent = tree.find(parent_ref)
    if not parent.is_container:
        containers = ", ".join(s.name for s in tree.sections if s.is_container)
        raise PromptEditError(f"section '{parent.name}' is a leaf; new sections go under the root or a "
                              f"container ({containers or 'there are none'})")
    return parent.path


def _add_entry(text: str, line: str) -> str:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    marker = next((k for k, raw in enumerate(lines) if raw.strip() == MARKER), None)
    if marker is None:  # only the root can lack a list; start one after the main paragraph
        if lines and lines[-1].strip():
            lines.append("\n")
        lines += [MARKER + "\n", line + "\n"]
    else:
        last = marker
        for k in range(marker + 1, len(lines)):
            if lines[k].strip():
                last = k
        lines.insert(last + 1, line + "\n")
    return "".join(lines)


def _remove(tree: PromptTree, section: Section) -> EditResult:
    name = section.name
    if section.is_container:
        raise PromptEditError(f"section '{name}' is a container; only leaf sections can be removed "
                              f"(children: {', '.join(section.children) or 'none'})")
    # By name, not find(): a section name made of digits would be taken for an index.
    parents = [s.path for s in tree.sections if s.name == section.parent]
    parent_path = parents[0] if parents else tree.folder / ROOT_FILE
    parent_before = _read(parent_path)
    parent_after = _drop_entry(parent_before, name)
    before = _read(section.path)
    # The list goes first: a crash in between leaves an unlisted file, never a listed missing one.
    _write(parent_path, parent_after)
    try:
        section.path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise PromptEditError(f"section '{name}' was taken out of the list but {section.path.name} "
                              f"could not be deleted: {exc.strerror or exc}") from exc
    return EditResult("remove", name, section.path, before, "", FileChange(parent_path, parent_before, parent_after))


def _drop_entry(text: str, name: str) -> str:
    lines = text.splitlines(keepends=True)
    marker = next(k for k, raw in enumerate(lines) if raw.strip() == MARKER)
    kept = lines[: marker + 1] + [
        raw for raw in lines[marker + 1 :] if raw.strip().partition(":")[0].strip() != name
    ]
    return "".join(kept)


# ---- files ----------------------------------------------------------------------------------------

_locks_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}


def _folder_lock(folder: Path) -> threading.Lock:
    # Edits are read-modify-write; two sessions editing the same folder from threads must not
    # interleave. (Other processes are not covered.)
    key = os.path.abspath(folder)
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def _read(path: Path, missing_ok: bool = False) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return ""
        raise PromptEditError(f"file {path.name} disappeared; reload the prompt and try again") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptEditError(f"cannot read {path.name}: {exc}") from exc


def _write(path: Path, text: str) -> None:
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise PromptEditError(f"could not write {path.name}: {exc.strerror or exc}; "
                              "the file was left as it was") from exc


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` so readers see either the old or the new file, never a mix."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o644  # mkstemp's 0600 would hide a shipped prompt from other users
    # The temp name starts with "..", so it never looks like a prompt file to the store's scan.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not every platform can open a directory, hence best effort.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
