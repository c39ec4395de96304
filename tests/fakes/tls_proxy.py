"""A local HTTPS-intercepting proxy: the way to fake a site a library reaches by a fixed https URL.

Libraries such as ddgs build their URLs in (`https://html.duckduckgo.com/html/`) but take a proxy
and a CA file, as a user behind a corporate proxy sets them. This proxy answers `CONNECT host:443`,
finishes TLS itself with a certificate for that host signed by its own throwaway CA (written to
`ca_file`), reads the HTTP/1.1 request inside and answers it with `handler(request)`. Nothing leaves
the machine: a host without a handler gets a 502.

    with TlsInterceptingProxy(tmp_path, handler) as proxy:
        DDGS(proxy=proxy.url, verify=str(proxy.ca_file)).text("q", backend="duckduckgo")
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(slots=True)
class ProxiedRequest:
    host: str
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes

    @property
    def form(self) -> dict[str, str]:
        """The url-encoded form body (a POST) or the query string (a GET), one value per key."""
        raw = self.body.decode() if self.method == "POST" else urlsplit(self.path).query
        return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()}


@dataclass(slots=True)
class ProxiedResponse:
    status: int = 200
    body: str = ""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[ProxiedRequest], ProxiedResponse]


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class Authority:
    """A throwaway CA (its certificate in `ca_file`) and one leaf certificate per host (a name or an
    IP address), made on first use; `context(host)` is a server's TLS context for it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(_name("aiops test CA")).issuer_name(_name("aiops test CA"))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=2))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
                     .sign(self.key, hashes.SHA256()))
        self.ca_file = folder / "proxy-ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._contexts: dict[str, ssl.SSLContext] = {}

    def context(self, host: str) -> ssl.SSLContext:
        if host in self._contexts:
            return self._contexts[host]
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.SubjectAlternativeName([_alt_name(host)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_file, key_file = self.folder / f"{host}.pem", self.folder / f"{host}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM)
                              + self.cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert_file, key_file)
        ctx.set_alpn_protocols(["http/1.1"])  # no h2: the fake speaks HTTP/1.1 only
        self._contexts[host] = ctx
        return ctx


class TlsInterceptingProxy:
    def __init__(self, folder: Path, handlers: dict[str, Handler]) -> None:
        """`handlers`: host name -> what answers requests to it."""
        self.handlers = handlers
        self.requests: list[ProxiedRequest] = []
        self.connects: list[str] = []  # every CONNECT target, handled or not
        self._authority = Authority(folder)
        self.ca_file = self._authority.ca_file
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> TlsInterceptingProxy:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def start() -> None:
                self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
                self.port = self._server.sockets[0].getsockname()[1]

            loop.run_until_complete(start())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="TlsInterceptingProxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None or self._thread is None:
            return

        async def shutdown() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            host = target.rsplit(":", 1)[0]
            self.connects.append(host)
            if host not in self.handlers:
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self._authority.context(host))
            while await self._serve_one(host, reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve_one(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        request = ProxiedRequest(host, method, path, headers, body)
        self.requests.append(request)
        resp = self.handlers[host](request)
        data = resp.body.encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items())
        writer.write(f"HTTP/1.1 {resp.status} X\r\nContent-Type: {resp.content_type}\r\n"
                     f"Content-Length: {len(data)}\r\n{extra}\r\n".encode() + data)
        await writer.drain()
        return headers.get("connection", "").lower() != "close"
