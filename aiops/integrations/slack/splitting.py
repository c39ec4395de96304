"""Long answers in parts: Slack cuts a message's text at 4,000 characters (and renders long ones
badly), so an answer is split at ~3,500 on paragraph or code-block boundaries, each part labelled
"(part i/n)" and every code block closed in the part that opens it (and reopened in the next)."""

from __future__ import annotations

from aiops.integrations.slack.markup import FENCE

PART_CHARS = 3500
# Room for the "_(part 12/34)_\n" label.
_LABEL_ROOM = 24


def _is_fence(line: str) -> bool:
    return line.lstrip().startswith(FENCE)


def _blocks(text: str) -> list[tuple[str, bool]]:
    """(text, is_code) blocks: paragraphs split at blank lines, fenced code blocks whole."""
    blocks: list[tuple[str, bool]] = []
    current: list[str] = []
    in_code = False
    for line in text.split("\n"):
        if in_code:
            current.append(line)
            if _is_fence(line):
                blocks.append(("\n".join(current), True))
                current, in_code = [], False
            continue
        if _is_fence(line):
            if current:
                blocks.append(("\n".join(current), False))
            current, in_code = [line], True
        elif not line.strip():
            if current:
                blocks.append(("\n".join(current), False))
            current = []
        else:
            current.append(line)
    if current:
        if in_code:  # an unclosed fence (a cut-off answer): close it so the rest is not code
            current.append(FENCE)
        blocks.append(("\n".join(current), in_code))
    return blocks


def _hard_split(line: str, size: int) -> list[str]:
    """A line longer than `size`: at the last space that fits, else at `size`."""
    out: list[str] = []
    while len(line) > size:
        cut = line.rfind(" ", 0, size + 1)
        if cut <= 0:
            cut = size
        out.append(line[:cut].rstrip())
        line = line[cut:].lstrip()
    out.append(line)
    return out


def _pieces(block: str, is_code: bool, size: int) -> list[str]:
    """A block longer than `size` as pieces that fit; a code block's pieces are each fenced."""
    if len(block) <= size:
        return [block]
    lines = block.split("\n")
    if is_code:
        opening, body = lines[0], lines[1:-1]
        size -= len(opening) + len(FENCE) + 2
    else:
        opening, body = "", lines
    chunks: list[list[str]] = [[]]
    used = 0
    for line in body:
        for piece in _hard_split(line, size):
            if chunks[-1] and used + len(piece) + 1 > size:
                chunks.append([])
                used = 0
            chunks[-1].append(piece)
            used += len(piece) + 1
    if is_code:
        return ["\n".join([opening, *c, FENCE]) for c in chunks]
    return ["\n".join(c) for c in chunks]


def split_message(text: str, limit: int = PART_CHARS) -> list[str]:
    """`text` in parts of at most `limit` characters (labels included), in order."""
    if len(text) <= limit:
        return [text]
    size = limit - _LABEL_ROOM
    parts: list[str] = []
    current = ""
    for block, is_code in _blocks(text):
        for piece in _pieces(block, is_code, size):
            if current and len(current) + 2 + len(piece) > size:
                parts.append(current)
                current = ""
            current = f"{current}\n\n{piece}" if current else piece
    if current:
        parts.append(current)
    n = len(parts)
    return [f"_(part {i}/{n})_\n{p}" for i, p in enumerate(parts, 1)] if n > 1 else parts
