"""What an MCP result becomes: text for the model, the whole of it for the operator.

The model gets text only, cut to the server's `max_result_chars` as head and tail with a marker
between (the end of a log or a listing matters as much as its start). Images, audio and binary
resources are written to files (artifacts) and named in one line, never pasted as base64 into the
context. The operator's copy (the tool message's `data`, kept in the history) has the full text
and the artifacts' paths.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The operator's copy of the text in the history; beyond this the full text is an artifact file.
FULL_TEXT_IN_HISTORY = 256 * 1024


@dataclass(slots=True)
class Rendered:
    text: str  # everything as text, artifacts named
    artifacts: list[dict[str, Any]] = field(default_factory=list)


def cut_for_model(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker_room = 120
    head = (limit - marker_room) * 2 // 3
    tail = limit - marker_room - head
    cut = len(text) - head - tail
    return (f"{text[:head]}\n[… {cut} characters cut by aiops (the operator has the full result); "
            f"ask for a narrower query if you need them …]\n{text[-tail:]}")


class ArtifactStore:
    """Files for what is not text, one folder per server."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def save(self, server: str, data: bytes, mime: str, hint: str = "") -> Path:
        folder = self.root / server
        folder.mkdir(parents=True, exist_ok=True)
        ext = mimetypes.guess_extension(mime or "") or ".bin"
        path = folder / f"{hint + '-' if hint else ''}{uuid.uuid4().hex[:12]}{ext}"
        path.write_bytes(data)
        return path


def _decode(b64: str) -> bytes:
    try:
        return base64.b64decode(b64, validate=False)
    except (binascii.Error, ValueError):
        return b64.encode()


def _artifact(store: ArtifactStore, server: str, kind: str, data: bytes, mime: str,
              out: Rendered, uri: str = "") -> None:
    path = store.save(server, data, mime, kind)
    out.artifacts.append({"kind": kind, "mime_type": mime, "bytes": len(data), "path": str(path),
                          **({"uri": uri} if uri else {})})
    size = f"{len(data) / 1024:.1f} kB" if len(data) >= 1024 else f"{len(data)} bytes"
    what = f"{kind} {mime}".strip() + (f" {uri}" if uri else "")
    out.text += f"[{what}, {size}: not shown to the model; saved for the operator as {path}]\n"


def render_contents(blocks: list[Any], store: ArtifactStore, server: str) -> Rendered:
    """Content blocks (tool results, prompt messages) or resource contents, as text + artifacts."""
    import mcp_types as mt  # (loaded by the connection already; kept out of the plugin's import)

    out = Rendered("")
    for block in blocks:
        match block:
            case mt.TextContent(text=text) | mt.TextResourceContents(text=text):
                out.text += text if text.endswith("\n") else text + "\n"
            case mt.ImageContent(data=data, mime_type=mime):
                _artifact(store, server, "image", _decode(data), mime, out)
            case mt.AudioContent(data=data, mime_type=mime):
                _artifact(store, server, "audio", _decode(data), mime, out)
            case mt.BlobResourceContents(blob=blob, mime_type=mime, uri=uri):
                _artifact(store, server, "resource", _decode(blob), mime or "application/octet-stream",
                          out, str(uri))
            case mt.EmbeddedResource(resource=res):
                inner = render_contents([res], store, server)
                out.text += inner.text
                out.artifacts += inner.artifacts
            case mt.ResourceLink(uri=uri, name=name):
                out.text += f"[resource link {name}: {uri}]\n"
            case _:
                out.text += f"[{type(block).__name__} content not shown]\n"
    out.text = out.text.rstrip("\n")
    return out


def operator_copy(rendered: Rendered, store: ArtifactStore, server: str, tool: str,
                  structured: Any = None) -> dict[str, Any]:
    """The `data` kept with the tool message: the whole text (or its file when very large)."""
    data: dict[str, Any] = {"mcp_server": server, "mcp_tool": tool, "chars": len(rendered.text)}
    if len(rendered.text) <= FULL_TEXT_IN_HISTORY:
        data["full_text"] = rendered.text
    else:
        path = store.save(server, rendered.text.encode(), "text/plain", "result")
        data["full_text_path"] = str(path)
    if rendered.artifacts:
        data["artifacts"] = rendered.artifacts
    if structured is not None:
        data["structured"] = structured
    return data
