"""Who is calling: bearer tokens with roles, and the loopback rule when there are none.

Tokens live in the environment (named by `token_env` in aiops.toml), are compared in constant time
and are never logged. A token whose variable is unset does not count as configured: the operator is
warned (by the variable's name) and, if no token is left, only loopback binds are allowed and
loopback callers act as operators.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import logging
import math
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiops.config import AuthConfig

log = logging.getLogger(__name__)

OPERATOR = "operator"
CLIENT = "client"

# A server reachable from the network is reachable by guessers: shorter tokens are refused there.
MIN_NETWORK_TOKEN_CHARS = 32
MAKE_TOKEN_HINT = 'make one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'


class BindRefused(Exception):
    """The server must not start as configured (a non-loopback bind without tokens, two tokens
    with one value); the message is for the operator."""


@dataclass(frozen=True, slots=True)
class Token:
    name: str
    role: str
    secret: bytes  # the SHA-256 of the token: equal lengths make the comparison length-blind too
    length: int = 0  # characters in the token (a network bind refuses short ones)

    def __repr__(self) -> str:  # never show the secret, even in a traceback
        return f"Token(name={self.name!r}, role={self.role!r})"


@dataclass(frozen=True, slots=True)
class Identity:
    role: str  # operator | client
    principal: str  # the token's name, "loopback:<addr>" or "anonymous:<addr>"
    authenticated: bool


def _digest(token: str) -> bytes:
    # A header aiohttp could not decode as UTF-8 holds surrogates: still hashed, never matching.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def load_tokens(auth: AuthConfig, env: Mapping[str, str], *, warn: bool = True) -> list[Token]:
    """The configured tokens whose environment variable is set (see `partly_unset` for which of
    the others are warned about)."""
    tokens: list[Token] = []
    if warn:
        for var in partly_unset(auth, env):
            name = next(n for n, tc in auth.tokens.items() if tc.token_env == var)
            log.warning("auth token %r is not configured: environment variable %s is unset", name, var)
    for name, tc in auth.tokens.items():
        value = env.get(tc.token_env, "")
        if not value.strip():
            continue
        token = Token(name, tc.role, _digest(value.strip()), len(value.strip()))
        if twin := next((t for t in tokens if hmac.compare_digest(t.secret, token.secret)), None):
            # Only one of them could ever match: the other's role (operator, say) would be lost.
            raise BindRefused(f"auth tokens {twin.name!r} and {name!r} have the same value (from "
                              f"{auth.tokens[twin.name].token_env} and {tc.token_env}): give each token "
                              f"its own")
        tokens.append(token)
    return tokens


def unset_token_vars(auth: AuthConfig, env: Mapping[str, str]) -> list[str]:
    """The `token_env` names of configured tokens whose variable is unset."""
    return [tc.token_env for tc in auth.tokens.values() if not env.get(tc.token_env, "").strip()]


def partly_unset(auth: AuthConfig, env: Mapping[str, str]) -> list[str]:
    """The unset token variables worth a warning: those of a configuration where some token *is*
    set (a half-made set-up). With none set at all, as shipped, the server runs open on loopback,
    which the ready line says; a non-loopback bind is refused with its own message."""
    unset = unset_token_vars(auth, env)
    return unset if len(unset) < len(auth.tokens) else []


def is_loopback_host(host: str) -> bool:
    """True for a bind address that only the local machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # "", "0.0.0.0"-like names and host names: assume reachable from outside


@functools.lru_cache(maxsize=256)
def is_loopback_peer(addr: str | None) -> bool:
    """Whether a caller's address is loopback (cached: every request of a tokenless server asks,
    and parsing the address is a measurable share of a proxied request)."""
    if not addr:
        return False
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@functools.lru_cache(maxsize=256)
def addressed_to_loopback(host: str | None) -> bool:
    """Whether a request's Host (`name[:port]`, `[v6]:port`) names this machine's loopback.

    A server without tokens trusts loopback callers; a web page can make the browser a loopback
    caller by pointing its own name at 127.0.0.1 (DNS rebinding), and its requests then carry
    that name as their Host. Loopback names and addresses are what local clients use."""
    if not host:
        return True  # HTTP/1.0 without Host: aiohttp falls back to the local address
    name = host.strip()
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    name = name.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost") or name == _HOSTNAME:
        return True  # (this machine's own name: Debian maps it to 127.0.1.1; no page is served from it)
    return is_loopback_peer(name)


_HOSTNAME = socket.gethostname().lower()


def check_bind(host: str, tokens: list[Token], auth: AuthConfig, env: Mapping[str, str]) -> None:
    """Refuse a non-loopback bind when no token is configured, or when a token is too short to
    stand up to guessing (under MIN_NETWORK_TOKEN_CHARS characters)."""
    if is_loopback_host(host):
        return
    short = [t for t in tokens if t.length < MIN_NETWORK_TOKEN_CHARS]
    if short:
        names = ", ".join(f"{t.name!r} ({auth.tokens[t.name].token_env}: {t.length} characters)"
                          if t.name in auth.tokens else repr(t.name) for t in short)
        raise BindRefused(f"refusing to listen on {host or 'all interfaces'}: a server reachable from the "
                          f"network needs tokens of at least {MIN_NETWORK_TOKEN_CHARS} characters, and "
                          f"{names} {'is' if len(short) == 1 else 'are'} shorter; {MAKE_TOKEN_HINT}")
    if tokens:
        return
    unset = unset_token_vars(auth, env)
    hint = (f" (set {', '.join(unset)} in the environment or .env)" if unset
            else " (add an [auth.tokens.NAME] table to aiops.toml with token_env and role, and set that "
                 "variable)")
    raise BindRefused(f"refusing to listen on {host or 'all interfaces'}: a non-loopback address needs "
                      f"at least one auth token{hint}; or bind 127.0.0.1")


class AuthThrottled(Exception):
    """An address presented too many invalid tokens; it may try again after `retry_after` s."""

    def __init__(self, retry_after: int, limit: int, window: float) -> None:
        super().__init__(f"too many invalid tokens from this address ({limit} in {window:g} s); "
                         f"try again in {retry_after} s")
        self.retry_after = retry_after


class FailedAuthThrottle:
    """Invalid tokens per address in a sliding window. Past the limit the address's tokens are not
    even checked until its oldest failure leaves the window, so guessing runs at `limit` tries per
    window at most. Memory is bounded: the least recently failing addresses are forgotten first."""

    MAX_ADDRESSES = 4096

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, addr: str) -> deque[float] | None:
        times = self._failures.get(addr)
        if times is None:
            return None
        cutoff = self._clock() - self.window
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._failures[addr]
            return None
        return times

    def check(self, addr: str) -> None:
        """Raise AuthThrottled when `addr` is over the limit."""
        if not self.limit:
            return
        times = self._recent(addr)
        if times is not None and len(times) >= self.limit:
            wait = max(1, math.ceil(times[0] + self.window - self._clock()))
            raise AuthThrottled(wait, self.limit, self.window)

    def failed(self, addr: str) -> None:
        if not self.limit:
            return
        times = self._recent(addr) or deque(maxlen=self.limit)
        times.append(self._clock())
        self._failures[addr] = times
        self._failures.move_to_end(addr)
        while len(self._failures) > self.MAX_ADDRESSES:
            self._failures.popitem(last=False)
        if len(times) == self.limit:
            log.warning("%d invalid tokens from %s in %g s: its tokens are refused until the window clears",
                        self.limit, addr, self.window)


class Authenticator:
    def __init__(self, tokens: list[Token], throttle: FailedAuthThrottle | None = None) -> None:
        self.tokens = tokens
        self.throttle = throttle or FailedAuthThrottle(0, 1)

    @property
    def open(self) -> bool:
        """No tokens: loopback callers are operators."""
        return not self.tokens

    def match(self, presented: str, peer: str | None = None) -> Token | None:
        """The token equal to `presented`; every token is compared, each in constant time.

        With `peer`, failures count against that address, and an address over the limit raises
        AuthThrottled without its token being compared."""
        addr = peer or "?"
        self.throttle.check(addr)
        given = _digest(presented)
        found: Token | None = None
        for t in self.tokens:
            if hmac.compare_digest(t.secret, given):
                found = t
        if found is None:
            self.throttle.failed(addr)
        return found


def bearer(header: str | None) -> str | None:
    """The credential of an `Authorization: Bearer …` header, or None."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
