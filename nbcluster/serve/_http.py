"""HTTP requests between the proxy and the replicas, as plain tuples.

The proxy reads a whole request (refusing bodies over the limit with 413) and sends it to
a replica as an :data:`HTTPRequest` tuple; the replica rebuilds an ASGI scope, runs the
user's Starlette/FastAPI app or ``__call__(request)``, and answers with an
:data:`HTTPAnswer` tuple ``(status, headers, body)``. Return values that are not
responses are converted the way Ray Serve does: ``None``/``bytes`` → ``text/plain``,
``str`` → ``text/plain; charset=utf-8``, anything else → JSON.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "HTTPAnswer",
    "HTTPRequest",
    "MODEL_ID_HEADER",
    "answer_from_value",
    "error_answer",
    "json_answer",
    "make_scope",
    "run_asgi",
    "text_answer",
]

#: ``(method, scheme, path, query_string, headers, body, client, root_path, http_version)``
HTTPRequest = tuple[str, str, str, bytes, list[tuple[bytes, bytes]], bytes, Any, str, str]
#: ``(status, headers, body)``
HTTPAnswer = tuple[int, list[tuple[bytes, bytes]], bytes]

#: The header that picks a multiplexed model (Ray's name).
MODEL_ID_HEADER = b"serve_multiplexed_model_id"


def make_scope(req: HTTPRequest) -> dict[str, Any]:
    """The ASGI ``http`` scope of a request."""
    method, scheme, path, query, headers, _body, client, root_path, http_version = req
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": http_version,
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": path.encode("utf-8"),
        "query_string": query,
        "root_path": root_path,
        "headers": headers,
        "client": client,
        "server": None,
    }


def text_answer(status: int, text: str) -> HTTPAnswer:
    """A ``text/plain`` answer."""
    return status, [(b"content-type", b"text/plain; charset=utf-8")], text.encode("utf-8")


def json_answer(status: int, value: Any) -> HTTPAnswer:
    """A JSON answer."""
    return status, [(b"content-type", b"application/json")], json.dumps(value).encode("utf-8")


def error_answer(status: int = 500) -> HTTPAnswer:
    """The body of a failed request: the status's phrase, never a traceback."""
    phrases = {
        404: "Not Found",
        408: "Request Timeout",
        413: "Request Entity Too Large",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }
    return text_answer(status, phrases.get(status, "Error"))


def _default(obj: Any) -> Any:
    tolist = getattr(obj, "tolist", None)  # numpy arrays and scalars
    if callable(tolist):
        return tolist()
    if hasattr(obj, "model_dump"):  # pydantic v2
        return obj.model_dump()
    if hasattr(obj, "__dict__"):
        return vars(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def answer_from_value(value: Any, status: int = 200) -> HTTPAnswer:
    """A handler's return value (not a Response) as an answer, the way Ray Serve converts it."""
    if value is None:
        return status, [(b"content-type", b"text/plain")], b""
    if isinstance(value, bytes):
        return status, [(b"content-type", b"text/plain")], value
    if isinstance(value, str):
        return status, [(b"content-type", b"text/plain; charset=utf-8")], value.encode("utf-8")
    body = json.dumps(value, default=_default, separators=(",", ":")).encode("utf-8")
    return status, [(b"content-type", b"application/json")], body


async def run_asgi(
    app: Callable[[dict[str, Any], Any, Any], Awaitable[None]],
    scope: dict[str, Any],
    body: bytes,
) -> HTTPAnswer:
    """Call an ASGI app with a complete request and collect its complete response."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    status = 500
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    return status, headers, b"".join(chunks)
