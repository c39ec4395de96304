"""The system prompt as a tree of section files: format, loading, assembly and caching.

A prompt folder holds a root file `.system_prompt`: the main paragraph, a `[SECTIONS]` line, then
one `name: description` line per child section. Each child lives in `.system_prompt_<name>` in the
same folder. A section file that has its own `[SECTIONS]` line is a container (the text before the
marker is its preamble, its children follow the same rule, to any depth); otherwise it is a leaf.
An optional first line `## ...` in a section file is a title for people editing the file, not
prompt content. The line right after it (or the first line, without a title) may be
`[REQUIRES tool_a, tool_b]`: the section, with everything under it, is then left out of the
assembled prompt unless every named tool is registered, so tool guidance follows the enabled
plugins. Listings still show such a section, marked inactive.

Loading never raises: loops, duplicates, missing or unreadable files and malformed list lines are
collected as `PromptError` data and the offending entry is skipped, so one bad file cannot take the
whole prompt down. Edits live in `aiops.prompts.ops`.
"""

from __future__ import annotations

import difflib
import os
import re
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT_FILE = ".system_prompt"
SECTION_PREFIX = ".system_prompt_"
MARKER = "[SECTIONS]"
# How the root is spelled in chains ("root > tools > tools_db"); it is a label, not a section.
ROOT = "root"

NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_HEADING_RE = re.compile(r"##(?:[ \t]|\r?\n|$)")
# `[REQUIRES a, b]`: tool names separated by commas and/or spaces. Upper case like `[SECTIONS]`.
_REQUIRES_RE = re.compile(r"\[REQUIRES(?:[ \t]+([^\]]*))?\]")

ErrorKind = Literal["loop", "duplicate", "missing", "invalid", "unreadable"]
SectionKind = Literal["leaf", "container"]


class PromptEditError(Exception):
    """A refused lookup or edit, phrased so the model or the operator can act on it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class PromptError:
    """A problem found while loading; the entry named here was left out of the prompt."""

    kind: ErrorKind
    name: str
    chain: tuple[str, ...]  # from ROOT to the offending name, inclusive
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Section:
    name: str
    description: str
    depth: int  # 1 for sections listed in the root file
    index: int  # 1-based, depth-first
    kind: SectionKind
    path: Path
    heading: str | None  # the file's `## ...` title without the hashes, if it has one
    body: str  # a leaf's text, or a container's preamble; no heading, outer blank lines stripped
    parent: str | None  # None for top-level sections
    children: tuple[str, ...]  # loaded children only, in list order
    requires: tuple[str, ...] = ()  # tools named by the file's `[REQUIRES ...]` line

    @property
    def is_container(self) -> bool:
        return self.kind == "container"

    @property
    def title(self) -> str:
        """The heading line used in the assembled prompt (without the hashes)."""
        return f"{self.name}: {self.description}" if self.description else self.name


# ---- the file format ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListEntry:
    name: str
    description: str
    line: str  # the line as written, for error messages


@dataclass(frozen=True)
class SectionFile:
    """One prompt file split into parts that render back to the same text.

    Edits change one part and render the rest verbatim, which is how a `## heading` and the
    `[SECTIONS]` list survive every write.
    """

    heading: str | None  # the first line as written, when it is a `## ` title
    lead: str  # blank lines between the header lines (or the start of the file) and the body
    body: str  # up to the marker line, or to the end of a leaf
    tail: str | None  # the marker line and everything after it; None for a leaf
    requires: str | None = None  # the `[REQUIRES ...]` line as written, right after the heading

    @classmethod
    def parse(cls, text: str, *, allow_heading: bool = True) -> SectionFile:
        lines = text.splitlines(keepends=True)
        heading: str | None = None
        start = 0
        requires: str | None = None
        if allow_heading and lines and _HEADING_RE.match(lines[0]):
            heading = lines[0].rstrip("\r\n")
            start = 1
        if allow_heading and start < len(lines) and _requires_names(lines[start]) is not None:
            requires = lines[start].rstrip("\r\n")
            start += 1
        first = start
        while first < len(lines) and not lines[first].strip():
            first += 1
        marker = next((k for k in range(first, len(lines)) if lines[k].strip() == MARKER), None)
        end = len(lines) if marker is None else marker
        return cls(
            heading=heading,
            lead="".join(lines[start:first]),
            body="".join(lines[first:end]),
            tail=None if marker is None else "".join(lines[marker:]),
            requires=requires,
        )

    @property
    def is_container(self) -> bool:
        return self.tail is not None

    @property
    def entries(self) -> list[ListEntry]:
        if self.tail is None:
            return []
        found = []
        for raw in self.tail.splitlines()[1:]:
            line = raw.strip()
            if line:
                name, _, description = line.partition(":")
                found.append(ListEntry(name.strip(), description.strip(), line))
        return found

    @property
    def required_tools(self) -> tuple[str, ...]:
        return () if self.requires is None else _requires_names(self.requires) or ()

    def render(self) -> str:
        head = "" if self.heading is None else self.heading + "\n"
        if self.requires is not None:
            head += self.requires + "\n"
        return head + self.lead + self.body + (self.tail or "")

    def with_body(self, body: str) -> SectionFile:
        lead = self.lead
        if not lead and self.requires is None:
            first = (body.splitlines() or [""])[0]  # as parse splits it
            if (self.heading is None and _HEADING_RE.match(body)) or _requires_names(first) is not None:
                # A body starting with `## ` or `[REQUIRES ...]` would be read back as the file's
                # title or condition and vanish from the prompt; a leading blank line keeps it content.
                lead = "\n"
        return SectionFile(self.heading, lead, body, self.tail, self.requires)


def _requires_names(line: str) -> tuple[str, ...] | None:
    """The tool names of a `[REQUIRES ...]` line, or None when the line is something else."""
    match = _REQUIRES_RE.fullmatch(line.strip())
    if match is None:
        return None
    return tuple(n for n in re.split(r"[\s,]+", match.group(1) or "") if n)


def section_path(folder: Path, name: str) -> Path:
    return folder / f"{SECTION_PREFIX}{name}"


def format_chain(chain: Sequence[str]) -> str:
    return " > ".join(chain)


# ---- the tree -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptTree:
    """An immutable snapshot of one prompt folder."""

    folder: Path
    main: str
    sections: tuple[Section, ...]  # depth-first; sections[i].index == i + 1
    errors: tuple[PromptError, ...]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sections]

    def missing_tools(self, section: Section, tools: Collection[str] | None) -> tuple[str, ...]:
        """Tools that `section` or one of its ancestors requires and `tools` lacks.

        `tools` None means "do not judge": nothing is missing.
        """
        if tools is None:
            return ()
        by_name = {s.name: s for s in self.sections}
        missing: list[str] = []
        current: Section | None = section
        while current is not None:
            missing.extend(t for t in current.requires if t not in tools and t not in missing)
            current = by_name.get(current.parent) if current.parent else None
        return tuple(missing)

    def active(self, tools: Collection[str] | None = None) -> tuple[Section, ...]:
        """The sections that go into the prompt when `tools` are registered (None: all of them)."""
        if tools is None:
            return self.sections
        return tuple(s for s in self.sections if not self.missing_tools(s, tools))

    def assemble(self, tools: Collection[str] | None = None) -> str:
        """The prompt text. With `tools` (the registered tool names) a section whose
        `[REQUIRES ...]` names a tool not among them is left out, with its descendants; without,
        every section is included."""
        blocks = [self.main] if self.main else []
        blocks.extend(_render_section(s) for s in self.active(tools))
        return "\n\n".join(blocks)

    def about_tool(self, tool: str) -> str:
        """The sections whose `[REQUIRES ...]` line names `tool`, as the prompt shows them: that
        tool's guidance on its own (a delegate that is given only this tool reads it); "" when
        no section is about it."""
        return "\n\n".join(_render_section(s) for s in self.sections if tool in s.requires)

    def subtree(self, section: Section) -> list[Section]:
        """The section followed by all its descendants (contiguous in depth-first order)."""
        found = [section]
        for other in self.sections[section.index:]:
            if other.depth <= section.depth:
                break
            found.append(other)
        return found

    def find(self, ref: str | int) -> Section:
        """A section by name or 1-based index; a string of digits counts as an index."""
        if isinstance(ref, str):
            ref = ref.strip()
            if ref.isascii() and ref.isdigit():
                ref = int(ref)
        if isinstance(ref, int):
            if 1 <= ref <= len(self.sections):
                return self.sections[ref - 1]
            numbered = f"sections are numbered 1-{len(self.sections)}" if self.sections else "there are no sections"
            raise PromptEditError(f"section index {ref} out of range; {numbered}")
        if not ref:
            raise PromptEditError(f"no section given; sections: {self._listing()}")
        for section in self.sections:
            if section.name == ref:
                return section
        for error in self.errors:
            if error.name == ref:
                raise PromptEditError(f"section '{ref}' is listed but not loaded: {error.message}")
        close = difflib.get_close_matches(ref, self.names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise PromptEditError(f"section '{ref}' not found; sections: {self._listing()}{hint}")

    def render_tree(self, tools: Collection[str] | None = None) -> str:
        """An indented listing with indexes and container markers, then the load errors.

        With `tools`, a section left out of the prompt for want of a tool is marked inactive.
        """
        lines = [f"system prompt: {self.folder}"]
        for s in self.sections:
            marker = " [container]" if s.is_container else ""
            description = f": {s.description}" if s.description else ""
            missing = self.missing_tools(s, tools)
            if missing:
                condition = f"  [inactive: needs {', '.join(missing)}]"
            elif s.requires:
                condition = f"  [requires {', '.join(s.requires)}]"
            else:
                condition = ""
            lines.append(f"{'  ' * s.depth}{s.index}. {s.name}{marker}{description}{condition}")
        if not self.sections:
            lines.append("  (no sections)")
        if self.errors:
            lines.append("errors:")
            lines.extend(f"  {e.message}" for e in self.errors)
        return "\n".join(lines)

    def _listing(self) -> str:
        return ", ".join(self.names) or "(none)"


def _render_section(section: Section) -> str:
    head = f"{'#' * (section.depth + 1)} {section.title}"
    return f"{head}\n{section.body}" if section.body else head


def load_tree(folder: Path) -> PromptTree:
    """Read a prompt folder. Never raises; every problem ends up in `PromptTree.errors`."""
    return _Loader(Path(folder)).load()


class _Loader:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.errors: list[PromptError] = []
        # Filled in depth-first order; a slot is reserved before the children are read so that a
        # parent's index comes before its children's.
        self.slots: list[Section | None] = []
        self.seen: dict[str, tuple[str, ...]] = {}

    def load(self) -> PromptTree:
        main = ""
        root = self.folder / ROOT_FILE
        text = self._read(root, ROOT, (ROOT,))
        if text is not None:
            parsed = SectionFile.parse(text, allow_heading=False)
            main = parsed.body.strip()
            self._walk(parsed.entries, None, ())
        sections = tuple(s for s in self.slots if s is not None)
        return PromptTree(self.folder, main, sections, tuple(self.errors))

    def _walk(self, entries: list[ListEntry], parent: str | None, ancestors: tuple[str, ...]) -> list[str]:
        loaded = []
        for entry in entries:
            name = entry.name
            chain = (ROOT, *ancestors, name)
            if not NAME_RE.fullmatch(name):
                self._error("invalid", name, chain, f"line '{entry.line}' is not 'name: description' "
                            "with a name of letters, digits, '_' or '-'")
                continue
            if name in ancestors:
                self._error("loop", name, chain, f"'{name}' would contain itself; entry skipped")
                continue
            if name in self.seen:
                self._error("duplicate", name, chain,
                            f"already at {format_chain(self.seen[name])}; entry skipped")
                continue
            path = section_path(self.folder, name)
            text = self._read(path, name, chain)
            if text is None:
                continue
            self.seen[name] = chain
            slot = len(self.slots)
            self.slots.append(None)
            parsed = SectionFile.parse(text)
            children = self._walk(parsed.entries, name, (*ancestors, name)) if parsed.is_container else []
            self.slots[slot] = Section(
                name=name,
                description=entry.description,
                depth=len(ancestors) + 1,
                index=slot + 1,
                kind="container" if parsed.is_container else "leaf",
                path=path,
                heading=None if parsed.heading is None else parsed.heading[2:].strip(),
                body=parsed.body.rstrip(),
                parent=parent,
                children=tuple(children),
                requires=parsed.required_tools,
            )
            loaded.append(name)
        return loaded

    def _read(self, path: Path, name: str, chain: tuple[str, ...]) -> str | None:
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._error("missing", name, chain, f"no file {path.name} in {self.folder}")
        except (OSError, UnicodeDecodeError) as exc:
            self._error("unreadable", name, chain, f"cannot read {path.name}: {exc}")
        return None

    def _error(self, kind: ErrorKind, name: str, chain: tuple[str, ...], detail: str) -> None:
        message = f"{kind}: {format_chain(chain)} ({detail})"
        self.errors.append(PromptError(kind, name, chain, message))


# ---- caching --------------------------------------------------------------------------------------

# (file name, mtime_ns, size, inode) per prompt file; the inode catches atomic replaces that keep
# the size within one mtime tick. None when the folder does not exist.
_Signature = tuple[tuple[str, int, int, int], ...] | None


def _signature(folder: Path) -> _Signature:
    try:
        with os.scandir(folder) as entries:
            found = []
            for entry in entries:
                if entry.name.startswith(ROOT_FILE):
                    try:
                        st = entry.stat()
                    except FileNotFoundError:
                        continue
                    found.append((entry.name, st.st_mtime_ns, st.st_size, st.st_ino))
    except (FileNotFoundError, NotADirectoryError):
        return None
    return tuple(sorted(found))


class PromptStore:
    """Trees per folder, reloaded only when a prompt file in that folder changed.

    A `get` costs one scandir of the folder and no file reads while nothing changed, so the engine
    can call it on every turn.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[_Signature, PromptTree]] = {}
        # (folder, scope) pairs already told that the folder is unusable; see `first_miss`.
        self._missed: set[tuple[Path, str | None]] = set()

    def first_miss(self, folder: Path, scope: str | None) -> bool:
        """True the first time `folder` is reported unusable within `scope` (a session), so the
        warning is given once rather than on every turn."""
        key = (Path(folder).absolute(), scope)
        with self._lock:
            if key in self._missed:
                return False
            self._missed.add(key)
            return True

    def found(self, folder: Path) -> None:
        """`folder` is usable again: a later failure is worth a new warning."""
        if self._missed:
            key = Path(folder).absolute()
            with self._lock:
                self._missed = {m for m in self._missed if m[0] != key}

    def get(self, folder: Path) -> PromptTree:
        key = Path(folder).absolute()
        with self._lock:
            # The signature is taken before reading, so a change racing with the load makes the
            # next get reload rather than keep a stale tree.
            signature = _signature(key)
            cached = self._cache.get(key)
            if cached is not None and cached[0] == signature:
                return cached[1]
            tree = load_tree(Path(folder))
            self._cache[key] = (signature, tree)
            return tree

    def reload(self, folder: Path | None = None) -> None:
        """Forget cached trees (one folder, or all); the next `get` reads from disk."""
        with self._lock:
            if folder is None:
                self._cache.clear()
            else:
                self._cache.pop(Path(folder).absolute(), None)
