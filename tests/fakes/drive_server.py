"""A fake Google Drive v3 API with Google's OAuth token endpoint, for the google_drive tool.

Holds files in memory (`add_file`), answers the calls the tool makes — list and name queries
(`'FOLDER' in parents and trashed = false and name = '...'`), metadata, `alt=media` downloads,
exports of Google-native documents, multipart creates, media updates, metadata patches (trash) —
and bumps a file's `version` on every change, as Drive does.

`/token` takes a service account's signed JWT (checked against `public_key` when one is set) or an
authorized user's refresh token, and hands out an access token every Drive call must carry.

`after_download(file)` runs after a file's content was sent: a test uses it to change the file
behind the tool's back (another editor) between its read and its write.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.fakes.openai_server import FakeServer


@dataclass(slots=True)
class DriveFile:
    id: str
    name: str
    parents: list[str]
    content: bytes = b""
    mimeType: str = "text/plain"  # noqa: N815 - Drive's field name
    trashed: bool = False
    version: int = 1

    def meta(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "name": self.name, "mimeType": self.mimeType, "parents": self.parents,
                             "trashed": self.trashed, "version": str(self.version),
                             "modifiedTime": "2026-11-27T10:00:00.000Z"}
        if not self.mimeType.startswith("application/vnd.google-apps."):
            d["size"] = str(len(self.content))
        return d


@dataclass(frozen=True, slots=True)
class DriveHit:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


def _b64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


@dataclass
class _Tokens:
    issued: set[str] = field(default_factory=set)
    assertions: list[dict[str, Any]] = field(default_factory=list)


class FakeDrive(FakeServer):
    def __init__(self, *, public_key: rsa.RSAPublicKey | None = None, refresh_token: str = "") -> None:
        super().__init__()
        self.files: dict[str, DriveFile] = {}
        self.hits: list[DriveHit] = []
        self.public_key = public_key
        self.refresh_token = refresh_token
        self.tokens = _Tokens()
        self.after_download: Callable[[DriveFile], None] | None = None
        self._lock = threading.Lock()

    def add_file(self, name: str, content: str | bytes = b"", *, parents: list[str],
                 mime: str = "text/plain", file_id: str | None = None) -> DriveFile:
        f = DriveFile(file_id or uuid.uuid4().hex[:20], name, parents,
                      content.encode() if isinstance(content, str) else content, mime)
        with self._lock:
            self.files[f.id] = f
        return f

    @property
    def token_uri(self) -> str:
        return self.base_url + "/token"

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/token", self._token)
        app.router.add_get("/drive/v3/files", self._list)
        app.router.add_get("/drive/v3/files/{id}", self._get)
        app.router.add_get("/drive/v3/files/{id}/export", self._export)
        app.router.add_patch("/drive/v3/files/{id}", self._patch)
        app.router.add_post("/upload/drive/v3/files", self._create)
        app.router.add_patch("/upload/drive/v3/files/{id}", self._update)

    # -- auth --

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        grant = form.get("grant_type")
        if grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            claims = self._check_jwt(str(form.get("assertion", "")))
            if claims is None:
                return web.json_response({"error": "invalid_grant", "error_description": "Invalid JWT Signature."},
                                         status=400)
            self.tokens.assertions.append(claims)
        elif grant == "refresh_token":
            if not self.refresh_token or form.get("refresh_token") != self.refresh_token:
                return web.json_response({"error": "invalid_grant", "error_description": "Bad Request"}, status=400)
        else:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        token = "ya29." + uuid.uuid4().hex
        self.tokens.issued.add(token)
        return web.json_response({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    def _check_jwt(self, jwt: str) -> dict[str, Any] | None:
        try:
            head, payload, sig = jwt.split(".")
            claims = json.loads(_b64(payload))
            if self.public_key is not None:
                self.public_key.verify(_b64(sig), f"{head}.{payload}".encode(), padding.PKCS1v15(), hashes.SHA256())
        except Exception:  # noqa: BLE001 - any malformed or badly signed JWT is refused
            return None
        if claims.get("exp", 0) < time.time():
            return None
        return claims

    def _authorized(self, request: web.Request) -> web.Response | None:
        with self._lock:
            self.hits.append(DriveHit(request.method, request.path, dict(request.query),
                                      {k.lower(): v for k, v in request.headers.items()}))
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or auth[7:] not in self.tokens.issued:
            return self._error(401, "Request had invalid authentication credentials.")
        return None

    @staticmethod
    def _error(code: int, message: str) -> web.Response:
        return web.json_response({"error": {"code": code, "message": message, "errors": [
            {"message": message, "domain": "global", "reason": "notFound" if code == 404 else "other"}]}},
            status=code)

    def _file(self, request: web.Request) -> DriveFile | None:
        f = self.files.get(request.match_info["id"])
        return f

    # -- files --

    async def _list(self, request: web.Request) -> web.Response:
        if (denied := self._authorized(request)) is not None:
            return denied
        q = request.query.get("q", "")
        files = list(self.files.values())
        for clause in (c.strip() for c in q.split(" and ") if c.strip()):
            if m := re.fullmatch(r"'((?:[^'\\]|\\.)*)' in parents", clause):
                files = [f for f in files if m.group(1) in f.parents]
            elif clause == "trashed = false":
                files = [f for f in files if not f.trashed]
            elif m := re.fullmatch(r"name = '((?:[^'\\]|\\.)*)'", clause):
                name = re.sub(r"\\(.)", r"\1", m.group(1))
                files = [f for f in files if f.name == name]
            else:
                return self._error(400, f"Invalid Value: {clause}")
        files.sort(key=lambda f: f.name)
        return web.json_response({"files": [f.meta() for f in files[:int(request.query.get("pageSize", 100))]]})

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._authorized(request)) is not None:
            return denied
        f = self._file(request)
        if f is None:
            return self._error(404, f"File not found: {request.match_info['id']}.")
        if request.query.get("alt") == "media":
            if f.mimeType.startswith("application/vnd.google-apps."):
                return self._error(403, "Only files with binary content can be downloaded. Use Export with "
                                        "Docs Editors files.")
            body = f.content
            if self.after_download is not None:
                self.after_download(f)
            return web.Response(body=body, content_type="application/octet-stream")
        return web.json_response(f.meta())

    async def _export(self, request: web.Request) -> web.Response:
        if (denied := self._authorized(request)) is not None:
            return denied
        f = self._file(request)
        if f is None:
            return self._error(404, "File not found.")
        return web.Response(body=f.content, content_type=request.query.get("mimeType", "text/plain"))

    async def _patch(self, request: web.Request) -> web.Response:
        if (denied := self._authorized(request)) is not None:
            return denied
        f = self._file(request)
        if f is None:
            return self._error(404, "File not found.")
        body = await request.json()
        if "trashed" in body:
            f.trashed = bool(body["trashed"])
        if "name" in body:
            f.name = body["name"]
        f.version += 1
        return web.json_response(f.meta())

    async def _create(self, request: web.Request) -> web.Response:
        if (denied := self._authorized(request)) is not None:
            return denied
        if request.query.get("uploadType") != "multipart":
            return self._error(400, "expected uploadType=multipart")
        reader = await request.multipart()
        meta_part = await reader.next()
        meta = json.loads(await meta_part.text())  # type: ignore[union-attr]
        content_part = await reader.next()
        content = await content_part.read() if content_part is not None else b""  # type: ignore[union-attr]
        f = self.add_file(meta["name"], bytes(content), parents=list(meta.get("parents") or []),
                          mime=meta.get("mimeType", "text/plain"))
        return web.json_response(f.meta())

    async def _update(self, request: web.Request) -> web.Response:
        if (denied := self._authorized(request)) is not None:
            return denied
        f = self._file(request)
        if f is None:
            return self._error(404, "File not found.")
        if request.query.get("uploadType") != "media":
            return self._error(400, "expected uploadType=media")
        f.content = await request.read()
        f.version += 1
        return web.json_response(f.meta())
