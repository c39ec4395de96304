"""Slack's markup both ways: a user's message to plain text, the model's Markdown to mrkdwn.

Incoming: Slack writes mentions, channels, links and special mentions as `<...>` sequences and
escapes `&`, `<` and `>` as entities; the model should read what the user saw.

Outgoing: our own converter on markdown-it-py (a parser Textual already brings), not a converter
from PyPI: the ones there pass the model's `<!channel>` or `<@U…>` through (the model could ping a
whole channel) and leave `<`, `>` and `&` in code unescaped (Slack then reads them as markup), and
one installs a top-level `tests` package. Here every character of the model's text is escaped, so
nothing it writes becomes a mention or a link Slack did not see in its Markdown.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.tree import SyntaxTreeNode

# ---- Slack markup -> text ---------------------------------------------------------------------------

_SEQUENCE = re.compile(r"<([^<>]*)>")
_SPECIAL = {"here": "@here", "channel": "@channel", "everyone": "@everyone"}


def _unescape(text: str) -> str:
    # `&amp;` last: `&amp;lt;` is the text "&lt;", not "<".
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def slack_to_text(text: str, bot_user_id: str | None = None) -> str:
    """A Slack message's text as the user saw it. The bot's own mentions are dropped (they only
    address the message); other users read as `@name` (or `@U…` when Slack sent no name)."""

    def sequence(m: re.Match[str]) -> str:
        inner = m.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            if bot_user_id and target[1:] == bot_user_id:
                return ""
            return "@" + (label.lstrip("@") or target[1:])
        if target.startswith("#"):
            return "#" + (label or target[1:])
        if target.startswith("!"):
            name = target[1:]
            if name in _SPECIAL:
                return _SPECIAL[name]
            # `<!subteam^S1|@oncall>`, `<!date^1700000000^{date}|Nov 14>`: the label is the text.
            return label or "@" + name.split("^", 1)[0]
        url = target
        if not label:
            return url.removeprefix("mailto:")
        bare = url.removeprefix("mailto:")
        if label in (url, bare) or re.sub(r"^https?://", "", url).rstrip("/") == label.rstrip("/"):
            return label
        return f"{label} ({url})"

    converted = _SEQUENCE.sub(sequence, text)
    # A dropped mention leaves its spaces: "<@BOT> hi" is "hi".
    converted = re.sub(r"[ \t]{2,}", " ", converted).strip()
    return _unescape(converted)


def mentions(text: str, user_id: str) -> bool:
    """The raw Slack text addresses `user_id` (`<@U…>` or `<@U…|name>`)."""
    return re.search(rf"<@{re.escape(user_id)}(\|[^>]*)?>", text) is not None


# ---- Markdown -> mrkdwn -----------------------------------------------------------------------------


def escape(text: str) -> str:
    """Text that Slack shows as written: its three control characters as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@functools.cache
def _parser() -> MarkdownIt:
    # Imported on first use: the plugin's module is loaded whenever plugins are discovered, even
    # with Slack disabled, and start-up should not pay for a parser it may never use.
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


_LINK_SCHEMES = ("http://", "https://", "mailto:")
_INDENT = "    "
FENCE = "```"


def markdown_to_mrkdwn(markdown: str) -> str:
    """The model's Markdown as Slack mrkdwn: emphasis, links, lists, quotes and code kept;
    headings bold; tables as aligned code blocks; everything else escaped text."""
    from markdown_it.tree import SyntaxTreeNode

    root = SyntaxTreeNode(_parser().parse(markdown))
    return _blocks(root.children).strip("\n")


def _blocks(nodes: Sequence[SyntaxTreeNode], sep: str = "\n\n") -> str:
    return sep.join(part for part in (_block(n) for n in nodes) if part)


def _block(node: SyntaxTreeNode) -> str:
    match node.type:
        case "paragraph":
            return _inline_of(node)
        case "heading":
            text = _inline_of(node, plain=True)
            return f"*{text}*" if text else ""
        case "fence" | "code_block":
            return _code(node.content)
        case "bullet_list" | "ordered_list":
            return _list(node)
        case "blockquote":
            inner = _blocks(node.children)
            return "\n".join("> " + line if line else ">" for line in inner.split("\n"))
        case "hr":
            return "───"
        case "table":
            return _table(node)
        case "html_block":
            return escape(node.content.rstrip("\n"))
        case "inline":
            return _inline(node.children)
    return _blocks(node.children)


def _code(content: str) -> str:
    body = escape(content)
    if body and not body.endswith("\n"):
        body += "\n"
    return f"{FENCE}\n{body}{FENCE}"


def _list(node: SyntaxTreeNode) -> str:
    ordered = node.type == "ordered_list"
    start = int(node.attrs.get("start", 1) or 1) if ordered else 1
    lines: list[str] = []
    for i, item in enumerate(node.children):
        marker = f"{start + i}. " if ordered else "• "
        body = _blocks(item.children, sep="\n").split("\n")
        lines.append(marker + body[0])
        lines.extend(_INDENT + line if line else line for line in body[1:])
    return "\n".join(lines)


def _table(node: SyntaxTreeNode) -> str:
    rows: list[list[str]] = []
    for section in node.children:  # thead, tbody
        for tr in section.children:
            rows.append([_plain(cell) for cell in tr.children])
    if not rows:
        return ""
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    sizes = [max(len(r[c]) for r in rows) for c in range(width)]
    lines = [" | ".join(cell.ljust(sizes[c]) for c, cell in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * s for s in sizes))
    return _code("\n".join(lines))


def _plain(node: SyntaxTreeNode) -> str:
    """The text of a node, without any markup (for table cells)."""
    if node.type in ("text", "code_inline"):
        return node.content
    if node.type in ("softbreak", "hardbreak"):
        return " "
    return "".join(_plain(c) for c in node.children)


def _inline_of(node: SyntaxTreeNode, plain: bool = False) -> str:
    return "".join(_inline(c.children, plain) for c in node.children if c.type == "inline")


def _inline(nodes: Sequence[SyntaxTreeNode], plain: bool = False) -> str:
    out: list[str] = []
    for n in nodes:
        match n.type:
            case "text" | "html_inline":
                out.append(escape(n.content))
            case "softbreak" | "hardbreak":
                out.append("\n")
            case "code_inline":
                out.append(f"`{escape(n.content)}`")
            case "strong" | "em" | "s":
                mark = "" if plain else {"strong": "*", "em": "_", "s": "~"}[n.type]
                out.append(f"{mark}{_inline(n.children, plain)}{mark}")
            case "link":
                out.append(_link(str(n.attrs.get("href", "")), _inline(n.children, plain=True)))
            case "image":
                alt = escape(_plain(n))
                out.append(_link(str(n.attrs.get("src", "")), alt) if n.attrs.get("src") else alt)
            case _:
                out.append(_inline(n.children, plain))
    return "".join(out)


def _link(url: str, label: str) -> str:
    """A Slack link for the web and mail addresses only; anything else stays readable text."""
    if not url.startswith(_LINK_SCHEMES):
        return f"{label} ({escape(url)})" if label and label != escape(url) else escape(url)
    # `|` and `>` end Slack's link syntax: percent-encoded they still reach the same address.
    target = escape(url).replace("|", "%7C")
    return f"<{target}|{label}>" if label and label != target else f"<{target}>"
