"""The OpenAPI 3.1 document of `/api/v1`, built from the route table and its pydantic models.

`api.ROUTES` is the single source: the same table registers the aiohttp routes, chooses the request
validation models and produces this document, so the document cannot drift from what is served.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import aiops

REF_TEMPLATE = "#/components/schemas/{model}"
_PARAM = re.compile(r"\{(\w+)\}")

STATUS_TEXT = {
    400: "Malformed JSON, a wrong type or an invalid value (the message names the field)",
    401: "Missing or invalid bearer token",
    403: ("The caller's role may not do this, the session belongs to another caller, or the request came "
          "from a web page whose origin cors_origins does not allow (or, without tokens, was addressed to a "
          "name that is not loopback)"),
    404: "No such session, gate or route",
    408: "The request body did not arrive in time",
    409: "The gate was already resolved",
    413: "The request body is larger than max_body_bytes",
    429: "Too many invalid tokens from this address: wait the Retry-After seconds",
    500: "Internal error (details in the server log)",
    503: "The server is shutting down",
}
COMMON_ERRORS = (401, 403, 413, 500, 503)


@dataclass(frozen=True)
class ApiRoute:
    """One `/api/v1` operation: what aiohttp routes and what the document says, in one place."""

    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    operation_id: str
    summary: str
    tag: str
    description: str = ""
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    also: dict[int, type[BaseModel]] = field(default_factory=dict)  # other success statuses
    errors: tuple[int, ...] = ()
    path_params: dict[str, str] = field(default_factory=dict)
    path_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # beyond {"type": "string"}
    public: bool = False
    operator_only: bool = False
    content_description: str = ""
    # Server-sent events: the media type is text/event-stream and each event's data is this model.
    event_model: type[BaseModel] | None = None

    @property
    def answers_head(self) -> bool:
        """HEAD is served for every GET but a stream (RFC 9110 asks it of GET resources; uptime
        probes use it). A stream has no end for HEAD to stop at."""
        return self.method == "GET" and self.event_model is None


def _parameters(route: ApiRoute, query_schemas: dict[str, Any]) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    for name in _PARAM.findall(route.path):
        params.append({"name": name, "in": "path", "required": True,
                       "schema": {"type": "string", **route.path_schemas.get(name, {})},
                       "description": route.path_params.get(name, "")})
    if route.query is not None:
        schema = query_schemas[route.query.__name__]
        required = set(schema.get("required", ()))
        for name, prop in schema.get("properties", {}).items():
            prop = dict(prop)
            desc = prop.pop("description", "")
            prop.pop("title", None)
            params.append({"name": name, "in": "query", "required": name in required, "schema": prop,
                           "description": desc})
    return params


def _head_operation(get: dict[str, Any]) -> dict[str, Any]:
    """HEAD of a GET operation: the same statuses and headers, no body."""
    op = {k: v for k, v in get.items() if k not in ("responses", "description")}
    op["operationId"] = get["operationId"] + "Head"
    op["summary"] = get["summary"] + " (headers only)"
    op["responses"] = {code: {"description": resp["description"]} for code, resp in get["responses"].items()}
    return op


def build_openapi(routes: Sequence[ApiRoute], error_model: type[BaseModel]) -> dict[str, Any]:
    inputs = {r.body for r in routes if r.body is not None}
    outputs = {m for r in routes for m in (r.response, *r.also.values(), r.event_model) if m is not None}
    outputs.add(error_model)
    queries = {r.query for r in routes if r.query is not None}
    pairs: list[tuple[type[BaseModel], Literal["validation", "serialization"]]] = []
    pairs += [(m, "validation") for m in sorted(inputs, key=lambda m: m.__name__)]
    pairs += [(m, "serialization") for m in sorted(outputs, key=lambda m: m.__name__)]
    refs, defs = models_json_schema(pairs, ref_template=REF_TEMPLATE)
    schemas: dict[str, Any] = defs.get("$defs", {})
    query_schemas = {q.__name__: q.model_json_schema() for q in queries}

    def ref(model: type[BaseModel], mode: Literal["validation", "serialization"]) -> dict[str, Any]:
        return refs[(model, mode)]

    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        op: dict[str, Any] = {
            "operationId": r.operation_id,
            "summary": r.summary,
            "tags": [r.tag],
        }
        description = r.description
        if r.operator_only:
            description = (description + "\n\n" if description else "") + "Needs the operator role."
        if description:
            op["description"] = description
        if r.public:
            op["security"] = []
        params = _parameters(r, query_schemas)
        if params:
            op["parameters"] = params
        if r.body is not None:
            op["requestBody"] = {"required": True,
                                 "content": {"application/json": {"schema": ref(r.body, "validation")}}}
        responses: dict[str, Any] = {}
        if r.event_model is not None:
            # OpenAPI 3.1 has no schema for a stream's items; the extension names the event data.
            responses[str(r.status)] = {
                "description": r.content_description or "OK",
                "content": {"text/event-stream": {"schema": {"type": "string"},
                                                  "x-event-data": ref(r.event_model, "serialization")}}}
        elif r.response is not None:
            responses[str(r.status)] = {
                "description": r.content_description or "OK",
                "content": {"application/json": {"schema": ref(r.response, "serialization")}}}
        else:
            responses[str(r.status)] = {"description": r.content_description or "OK",
                                        "content": {"application/json": {"schema": {"type": "object"}}}}
        for status, model in r.also.items():
            responses[str(status)] = {
                "description": model.__doc__.strip().splitlines()[0] if model.__doc__ else "OK",
                "content": {"application/json": {"schema": ref(model, "serialization")}}}
        codes = set(r.errors) | set(COMMON_ERRORS)
        if r.body is not None:
            codes |= {400, 408}
        if r.query is not None:
            codes.add(400)
        if r.operator_only:
            codes.add(403)
        if r.public:
            codes.discard(401)
        else:
            codes.add(429)  # the failed-authentication throttle
        for code in sorted(codes):
            responses[str(code)] = {
                "description": STATUS_TEXT.get(code, "Error"),
                "content": {"application/json": {"schema": ref(error_model, "serialization")}},
            }
        op["responses"] = responses
        paths.setdefault(r.path, {})[r.method.lower()] = op
        if r.answers_head:
            paths[r.path]["head"] = _head_operation(op)

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "aiops API",
            "version": aiops.__version__,
            "description": (
                "Submit messages to the aiops agent, stream its events, read and manage sessions, "
                "and resolve gates. Errors are `{\"error\": {\"code\", \"message\"}}`. With tokens "
                "configured every operation except health needs `Authorization: Bearer <token>`. "
                "Operator tokens may use every session and resolve gates; client tokens may chat and "
                "use only the sessions they created (and see only those sessions' gates)."
            ),
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
