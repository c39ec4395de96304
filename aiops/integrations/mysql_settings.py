"""The `[mysql]` settings of plugins.toml and the connection parameters they resolve to (the DSN
included), for the runner in aiops.integrations.mysql."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True, slots=True)
class ConnectionParams:
    """Effective connection parameters, resolved from settings and the environment."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def describe(self) -> str:
        """Safe for logs: everything but the password."""
        return f"{self.user}@{self.host}:{self.port}/{self.database}"


class MySQLSettings(BaseModel):
    """The `[mysql]` table of plugins.toml."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = Field(3306, ge=1, le=65535)
    user: str = "root"
    # Name of an env var holding the password. Left out of the file, an unset MYSQL_PASSWORD means
    # an empty password; named in the file, the variable must be set (see `missing_secret`).
    password_env: str | None = "MYSQL_PASSWORD"
    # Name of an env var holding a DSN (mysql://user:pass@host:3306/db) that overrides the fields.
    dsn_env: str | None = None
    database: str = "test"
    pool_size: int = Field(5, ge=1)
    max_rows: int = Field(200, ge=1)
    # 0 disables the limit.
    statement_timeout_ms: int = Field(10000, ge=0)

    def missing_secret(self, env: Mapping[str, str] | None = None) -> str | None:
        """Why the configured secrets cannot be read, or None.

        A variable the user named (`dsn_env`, or `password_env` written in the file) but did not
        set is a mistake to report, not a reason to connect with other credentials: without it the
        runner would silently fall back to the host/user fields and an empty password. Set to an
        empty value counts as set (a server without a password).
        """
        env = os.environ if env is None else env
        named = [("dsn_env", self.dsn_env)]
        if "password_env" in self.model_fields_set:
            named.append(("password_env", self.password_env))
        for key, var in named:
            if var and var not in env:
                return f"environment variable {var} is not set ({key} in [mysql])"
        return None

    def connection_params(self, env: Mapping[str, str] | None = None) -> ConnectionParams:
        """Resolve host, port, user, password and database from these settings and `env`.

        A DSN (when `dsn_env` names a set variable) overrides the fields; parts it leaves out fall back
        to them, and a DSN without a password takes it from `password_env`. Raises ValueError (without
        echoing the DSN, which may hold the password) when the DSN is malformed.
        """
        env = os.environ if env is None else env
        password = env.get(self.password_env, "") if self.password_env else ""
        params = ConnectionParams(self.host, self.port, self.user, password, self.database)
        dsn = env.get(self.dsn_env, "").strip() if self.dsn_env else ""
        if not dsn:
            return params
        return _params_from_dsn(dsn, params, source=f"${self.dsn_env}")


def _params_from_dsn(dsn: str, fallback: ConnectionParams, *, source: str) -> ConnectionParams:
    try:
        parts = urlsplit(dsn)
        port = parts.port
    except ValueError:
        # Not chained: urlsplit's message can quote the netloc, password included.
        raise ValueError(f"{source}: not a valid DSN (expected mysql://user:password@host:3306/database)") \
            from None
    if parts.scheme.lower() not in ("mysql", "mariadb"):
        raise ValueError(f"{source}: DSN scheme must be mysql:// or mariadb://, not {parts.scheme or 'none'}")
    if not parts.hostname:
        raise ValueError(f"{source}: DSN has no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{source}: DSN options (?…) are not supported")
    database = unquote(parts.path.lstrip("/"))
    if "/" in database:
        raise ValueError(f"{source}: DSN path must be a single database name")
    return ConnectionParams(
        host=parts.hostname,
        port=port or 3306,
        user=unquote(parts.username) if parts.username else fallback.user,
        password=unquote(parts.password) if parts.password is not None else fallback.password,
        database=database or fallback.database,
    )
