"""The server extension's REST routes against a server that requires auth (RELIABILITY S04–S07).

Covers: every route refuses requests without a token (route inventory, default-deny);
cookie-authenticated state changes need XSRF; foreign ``Origin`` and ``Host`` are
blocked; ids are matched in full; bodies are validated strictly; errors never carry a
traceback; and the start → list → load → scale → stop cycle leaves no process behind.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPResponse

from nbcluster import LocalCluster
from nbcluster.jupyter.server.app import all_routes as routes  # with the Serve route
from nbcluster.jupyter.server.handlers import API_PREFIX, NbclusterHandler
from nbcluster.jupyter.server.manager import ClusterManager
from nbcluster.testing import assert_no_processes

VERBS = ("get", "post", "put", "patch", "delete")
SOME_ID = "0123456789ab"
BROWSER_UA = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/156.0.0.0 Safari/537.36"
)


def _url_parts(pattern: str) -> tuple[str, ...]:
    """A concrete path for a route pattern, as jp_fetch parts."""
    path = pattern.replace("([^/]+)", SOME_ID)
    return tuple(path.strip("/").split("/"))


def _route_verbs() -> list[tuple[str, str]]:
    out = []
    for pattern, handler in routes():
        for verb in VERBS:
            if verb in vars(handler):
                out.append((pattern, verb))
    return out


async def _fetch(jp_fetch: Any, *parts: str, **kwargs: Any) -> HTTPResponse:
    kwargs.setdefault("raise_error", False)
    kwargs.setdefault("request_timeout", 120)  # starting processes on a loaded CI machine
    if kwargs.get("method") in ("POST", "PATCH", "PUT"):
        kwargs.setdefault("body", "{}")
    else:
        kwargs.pop("body", None)
    return await jp_fetch(*parts, **kwargs)


async def _api(jp_fetch: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """Call the API with the token; return (status, parsed JSON or None)."""
    kwargs: dict[str, Any] = {"method": method}
    if body is not None:
        kwargs["body"] = body if isinstance(body, str) else json.dumps(body)
    r = await _fetch(jp_fetch, "nbcluster", "api", *path.split("/"), **kwargs)
    return r.code, (json.loads(r.body) if r.body else None)


def _assert_error_body(r: HTTPResponse) -> dict[str, Any]:
    body = json.loads(r.body)
    assert isinstance(body["message"], str) and body["message"]
    assert "Traceback" not in r.body.decode()
    assert not body.get("traceback")
    return body


# -- S05: route inventory ---------------------------------------------------------------------


def test_route_inventory_every_verb_is_decorated() -> None:
    """Every handler is an NbclusterHandler whose verbs all carry the auth decorators."""
    seen = _route_verbs()
    assert {p for p, _ in seen} == {p for p, _ in routes()}, "a route has no verb at all"
    for pattern, handler in routes():
        assert pattern.startswith(API_PREFIX + "/")
        assert issubclass(handler, NbclusterHandler)
        for verb in VERBS:
            method = vars(handler).get(verb)
            if method is not None:
                assert hasattr(method, "__wrapped__"), f"{handler.__name__}.{verb} lacks auth"


def test_server_reports_no_unauthenticated_handler(tmp_path: Path) -> None:
    """jupyter_server warns about handlers without an auth decorator; there must be none."""
    script = """
import sys, warnings
from jupyter_server.serverapp import ServerApp
from jupyter_server.utils import JupyterServerAuthWarning
app = ServerApp(allow_unauthenticated_access=False,
                jpserver_extensions={"nbcluster.jupyter.server": True},
                reraise_server_extension_failures=True)
with warnings.catch_warnings(record=True) as records:
    warnings.simplefilter("always")
    app.initialize(argv=[], find_extensions=False, new_httpserver=False)
bad = [str(r.message) for r in records if issubclass(r.category, JupyterServerAuthWarning)]
def walk(router):
    for rule in getattr(router, "rules", []):
        regex = getattr(rule.matcher, "regex", None)
        if regex is not None and "/nbcluster/api/" in regex.pattern:
            yield regex.pattern
        yield from walk(rule.target)
print(len(set(walk(app.web_app.default_router))))
sys.exit("\\n".join(bad) if bad else 0)
"""
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path), "JUPYTER_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.strip().splitlines()[-1]) == len(routes())


@pytest.mark.parametrize(("pattern", "verb"), _route_verbs())
async def test_no_token_is_refused(
    jp_fetch: Any, manager: ClusterManager, pattern: str, verb: str
) -> None:
    """S04(a)/S05: without a token every route answers 401 or 403, and does nothing."""
    r = await _fetch(
        jp_fetch, *_url_parts(pattern), method=verb.upper(), headers={"Authorization": ""}
    )
    assert r.code in (401, 403), (pattern, verb, r.code)
    assert manager.owned_clusters() == {}


@pytest.mark.parametrize(("pattern", "verb"), _route_verbs())
async def test_wrong_token_is_refused(jp_fetch: Any, pattern: str, verb: str) -> None:
    r = await _fetch(
        jp_fetch,
        *_url_parts(pattern),
        method=verb.upper(),
        headers={"Authorization": "token not-the-token", "User-Agent": BROWSER_UA},
    )
    assert r.code in (401, 403), (pattern, verb, r.code)


# -- S06: traversal in the URL's path segments ----------------------------------------------

PATH_SEGMENT_VARIANTS = [
    "..",
    "..%2F..%2Ftoken",  # tornado decodes a path argument once: '../../token'
    "%2e%2e%2f%2e%2e%2ftoken",
    "%252e%252e%252ftoken",  # double-encoded: '%2e%2e%2ftoken' after the decode
    "%2Fetc%2Fpasswd",  # absolute
    f"{SOME_ID}-evil",  # sibling prefix of a well-formed id
    "%5C%5Chost%5Cshare",  # UNC
    f"{SOME_ID}%00",  # NUL
    f"{SOME_ID}%0a",
]


def _raw_paths(pattern: str, segment: str) -> list[str]:
    """The route with ``segment`` (sent as is, not re-encoded) in each argument in turn."""
    parts = re.split(r"\([^)]*\)", pattern)
    n = len(parts) - 1
    out = []
    for i in range(n):
        args = [segment if j == i else SOME_ID for j in range(n)]
        out.append("".join(p + a for p, a in zip(parts, [*args, ""], strict=True)))
    return out


@pytest.mark.parametrize("segment", PATH_SEGMENT_VARIANTS)
async def test_traversal_in_any_path_argument_is_refused(
    http_server_client: Any,
    jp_base_url: str,
    jp_auth_header: dict[str, str],
    manager: ClusterManager,
    segment: str,
) -> None:
    """S06: every argument of every route, raw-encoded traversal in it: a JSON 4xx, no effect."""
    tried = 0
    for pattern, verb in _route_verbs():
        for path in _raw_paths(pattern, segment):
            method = verb.upper()
            r = await http_server_client.fetch(
                jp_base_url.rstrip("/") + path,
                method=method,
                headers=dict(jp_auth_header),
                body="{}" if method in ("POST", "PATCH", "PUT") else None,
                allow_nonstandard_methods=True,
                raise_error=False,
                request_timeout=60,
            )
            assert r.code in (400, 404), (path, method, r.code)
            if r.headers.get("Content-Type", "").startswith("application/json"):
                _assert_error_body(r)
            tried += 1
    assert tried >= 20  # every job, cluster and Serve route argument was reached
    assert manager.owned_clusters() == {}


# -- S04: XSRF, Origin, Host ------------------------------------------------------------------


async def _login_cookies(jp_fetch: Any, jp_serverapp: Any) -> SimpleCookie:
    """Log in the way a browser does (token once in the URL) and return its cookies."""
    token = jp_serverapp.identity_provider.token
    r = await jp_fetch("api", "status", params={"token": token}, headers={"Authorization": ""})
    jar: SimpleCookie = SimpleCookie()
    for header in r.headers.get_list("Set-Cookie"):
        jar.load(header)
    assert any(name.startswith("username-") for name in jar), "no login cookie was set"
    r = await jp_fetch(
        "lab", raise_error=False, headers={"Authorization": "", "Cookie": _cookie_header(jar)}
    )
    for header in r.headers.get_list("Set-Cookie"):
        jar.load(header)
    if "_xsrf" not in jar:
        r = await jp_fetch("login", raise_error=False, headers={"Authorization": ""})
        for header in r.headers.get_list("Set-Cookie"):
            jar.load(header)
    assert "_xsrf" in jar, "the server set no _xsrf cookie"
    return jar


def _cookie_header(jar: SimpleCookie) -> str:
    return "; ".join(f"{k}={m.value}" for k, m in jar.items())


@pytest.mark.parametrize(("pattern", "verb"), [(p, v) for p, v in _route_verbs() if v != "get"])
async def test_cookie_without_xsrf_is_refused(
    jp_fetch: Any, jp_serverapp: Any, manager: ClusterManager, pattern: str, verb: str
) -> None:
    """S04(b): a logged-in browser's state-changing request without the XSRF token → 403."""
    jar = await _login_cookies(jp_fetch, jp_serverapp)
    login_only = "; ".join(f"{k}={m.value}" for k, m in jar.items() if k != "_xsrf")
    for cookie in (login_only, _cookie_header(jar)):  # with and without the _xsrf cookie
        r = await _fetch(
            jp_fetch,
            *_url_parts(pattern),
            method=verb.upper(),
            body='{"num_cpus": 1, "nodes": 1}',
            headers={"Authorization": "", "Cookie": cookie, "User-Agent": BROWSER_UA},
        )
        assert r.code == 403, (pattern, verb, r.code)
    assert manager.owned_clusters() == {}


async def test_cookie_with_xsrf_is_accepted(
    jp_fetch: Any, jp_serverapp: Any, manager: ClusterManager
) -> None:
    """The same browser request with the XSRF header works (so the 403s above mean XSRF)."""
    jar = await _login_cookies(jp_fetch, jp_serverapp)
    r = await _fetch(
        jp_fetch,
        "nbcluster",
        "api",
        "addresses",
        method="POST",
        body='{"address": "127.0.0.1:9"}',
        headers={
            "Authorization": "",
            "Cookie": _cookie_header(jar),
            "X-XSRFToken": jar["_xsrf"].value,
            "User-Agent": BROWSER_UA,
        },
    )
    assert r.code == 201, r.body


@pytest.mark.parametrize(("pattern", "verb"), _route_verbs())
async def test_foreign_origin_is_blocked(
    jp_fetch: Any, jp_serverapp: Any, manager: ClusterManager, pattern: str, verb: str
) -> None:
    """S04(c,e): a cross-site request from a logged-in browser (cookie, even with the XSRF
    token and a browser User-Agent) is blocked by its foreign ``Origin``.

    A request carrying the server token itself is exempt from the Origin check by
    jupyter_server's design (a foreign page cannot know the token), so it is not tested
    here; without the token, every route refuses (``test_no_token_is_refused``).
    """
    jar = await _login_cookies(jp_fetch, jp_serverapp)
    r = await _fetch(
        jp_fetch,
        *_url_parts(pattern),
        method=verb.upper(),
        body='{"num_cpus": 1, "nodes": 1}',
        headers={
            "Authorization": "",
            "Cookie": _cookie_header(jar),
            "X-XSRFToken": jar["_xsrf"].value,
            "Origin": "http://attacker.example",
            "User-Agent": BROWSER_UA,
        },
    )
    assert r.code in (403, 404), (pattern, verb, r.code)
    assert b"cluster_id" not in r.body and b'"clusters"' not in r.body
    assert manager.owned_clusters() == {}


@pytest.mark.parametrize(("pattern", "verb"), _route_verbs())
async def test_foreign_host_is_refused(
    jp_fetch: Any, manager: ClusterManager, pattern: str, verb: str
) -> None:
    """S04(d): DNS rebinding (``Host: attacker.example``) → 403, even with the token."""
    r = await _fetch(
        jp_fetch,
        *_url_parts(pattern),
        method=verb.upper(),
        body='{"num_cpus": 1, "nodes": 1}',
        headers={"Host": "attacker.example", "User-Agent": BROWSER_UA},
    )
    assert r.code == 403, (pattern, verb, r.code)
    assert manager.owned_clusters() == {}


# -- 404s and 400s ----------------------------------------------------------------------------

BAD_IDS = [
    SOME_ID,  # well-formed but unknown
    "0123456789AB",
    "0123456789abc",
    "0123456789a",
    "..",
    "%2e%2e",
    "0123456789ab%0a",
    "0123456789ab;id",
    "g123456789ab",
]


@pytest.mark.parametrize("bad_id", BAD_IDS)
@pytest.mark.parametrize(
    ("suffix", "method", "body"),
    [
        ("", "GET", None),
        ("", "PATCH", {"nodes": 2}),
        ("", "DELETE", None),
        ("/load", "GET", None),
        ("/connect-code", "POST", {}),
    ],
)
async def test_unknown_or_malformed_id_is_404(
    jp_fetch: Any, manager: ClusterManager, bad_id: str, suffix: str, method: str, body: Any
) -> None:
    code, reply = await _api(jp_fetch, method, f"clusters/{bad_id}{suffix}", body)
    assert code == 404, (bad_id, suffix, method, code)
    if reply is not None:
        assert reply["message"]


BAD_START_BODIES = [
    ("not json", "must be JSON"),
    ("[1, 2]", "JSON object"),
    ('"x"', "JSON object"),
    ("{}", "missing 'num_cpus', 'nodes'"),
    ('{"num_cpus": 2}', "missing 'nodes'"),
    ('{"num_cpus": 2, "nodes": 1, "env": {"X": "1"}}', "unexpected 'env'"),
    ('{"num_cpus": true, "nodes": 1}', "whole number"),
    ('{"num_cpus": 2.0, "nodes": 1}', "whole number"),
    ('{"num_cpus": "2", "nodes": 1}', "whole number"),
    ('{"num_cpus": null, "nodes": 1}', "whole number"),
    ('{"num_cpus": 0, "nodes": 1}', "from 1 to"),
    ('{"num_cpus": -1, "nodes": 1}', "from 1 to"),
    ('{"num_cpus": 2, "nodes": 0}', "from 1 to"),
    ('{"num_cpus": 100000, "nodes": 1}', "from 1 to"),
    ('{"num_cpus": 2, "nodes": 1000}', "from 1 to"),
    ('{"num_cpus": 2, "nodes": 1, "pad": "' + "x" * 5000 + '"}', "larger than"),
]


@pytest.mark.parametrize(("body", "message"), BAD_START_BODIES)
async def test_bad_start_body_is_400(
    jp_fetch: Any, manager: ClusterManager, body: str, message: str
) -> None:
    r = await _fetch(jp_fetch, "nbcluster", "api", "clusters", method="POST", body=body)
    assert r.code == 400, (body, r.code)
    assert message in _assert_error_body(r)["message"]
    assert manager.owned_clusters() == {}


@pytest.mark.parametrize(
    "body",
    ["{}", '{"nodes": "2"}', '{"nodes": 0}', '{"nodes": 2, "num_cpus": 4}', "[]", "nodes=2"],
)
async def test_bad_scale_body_is_400(jp_fetch: Any, manager: ClusterManager, body: str) -> None:
    code, created = await _api(jp_fetch, "POST", "addresses", {"address": "127.0.0.1:9"})
    assert code == 201
    r = await _fetch(
        jp_fetch, "nbcluster", "api", "clusters", created["id"], method="PATCH", body=body
    )
    assert r.code == 400, (body, r.code)
    _assert_error_body(r)


@pytest.mark.parametrize(
    "address",
    [
        "",
        "localhost",
        "127.0.0.1:0",
        "127.0.0.1:70000",
        "a b:1",
        "host:1\n%system id",
        "host:1; id",
        "'host':1",
        "http://host:1",
        "[::1:1",
        "-host:1",
        "x" * 400 + ":1",
    ],
)
async def test_bad_address_is_400(jp_fetch: Any, address: str) -> None:
    r = await _fetch(
        jp_fetch,
        "nbcluster",
        "api",
        "addresses",
        method="POST",
        body=json.dumps({"address": address}),
    )
    assert r.code == 400, (address, r.code)
    assert "host:port" in _assert_error_body(r)["message"]


async def test_server_error_has_no_traceback(jp_fetch: Any, manager: ClusterManager) -> None:
    """S07: an unexpected exception in a handler → 500 with a message, no traceback/details."""
    code, created = await _api(jp_fetch, "POST", "clusters", {"num_cpus": 1, "nodes": 1})
    assert code == 201

    def broken(address: str, token_file: str) -> dict[str, Any]:
        raise RuntimeError("secret-detail-in-exception")

    manager._status_reader = broken
    r = await _fetch(jp_fetch, "nbcluster", "api", "clusters", created["id"], "load")
    assert r.code == 500
    _assert_error_body(r)
    assert b"secret-detail-in-exception" not in r.body
    assert b'File "' not in r.body


async def test_unreachable_head_is_503_with_a_message(
    jp_fetch: Any, manager: ClusterManager
) -> None:
    code, created = await _api(jp_fetch, "POST", "clusters", {"num_cpus": 1, "nodes": 1})
    assert code == 201

    def unreachable(address: str, token_file: str) -> dict[str, Any]:
        raise ConnectionError("connection refused")

    manager._status_reader = unreachable
    r = await _fetch(jp_fetch, "nbcluster", "api", "clusters", created["id"], "load")
    assert r.code == 503
    message = _assert_error_body(r)["message"]
    assert re.fullmatch(rf"the head at {re.escape(created['address'])} did not answer: .+", message)


# -- the cluster life cycle -------------------------------------------------------------------


async def test_start_list_load_scale_stop(jp_fetch: Any, manager: ClusterManager) -> None:
    code, created = await _api(jp_fetch, "POST", "clusters", {"num_cpus": 2, "nodes": 1})
    assert code == 201, created
    cid = created["id"]
    assert created["origin"] == "panel" and created["nodes"] == 1 and created["num_cpus"] == 2
    assert created["can_scale"] and created["can_stop"] and not created["can_forget"]
    session_dir = created["session_dir"]

    code, listing = await _api(jp_fetch, "GET", "clusters")
    assert code == 200
    assert [c["id"] for c in listing["clusters"]] == [cid]
    code, one = await _api(jp_fetch, "GET", f"clusters/{cid}")
    assert code == 200 and one == listing["clusters"][0]

    code, load = await _api(jp_fetch, "GET", f"clusters/{cid}/load")
    assert code == 200, load
    assert load["source"] == "head" and load["cluster_id"] == cid
    assert load["cpu_total"] == 2.0 and load["cpu_used"] == 0.0 and load["nodes"] == 1
    assert load["store_capacity"] > 0 and load["store_used"] >= 0

    code, cc = await _api(jp_fetch, "POST", f"clusters/{cid}/connect-code", {})
    assert code == 200
    assert cc["code"] == f"%load_ext nbcluster\n%cluster connect {created['address']}"

    code, scaled = await _api(jp_fetch, "PATCH", f"clusters/{cid}", {"nodes": 2})
    assert code == 200, scaled
    assert scaled["nodes"] == 2
    code, load = await _api(jp_fetch, "GET", f"clusters/{cid}/load")
    assert load["cpu_total"] == 4.0 and load["nodes"] == 2

    code, scaled = await _api(jp_fetch, "PATCH", f"clusters/{cid}", {"nodes": 1})
    assert code == 200 and scaled["nodes"] == 1

    code, _ = await _api(jp_fetch, "DELETE", f"clusters/{cid}")
    assert code == 204
    assert_no_processes(session_dir, timeout=15)
    code, listing = await _api(jp_fetch, "GET", "clusters")
    assert listing["clusters"] == []
    code, _ = await _api(jp_fetch, "GET", f"clusters/{cid}")
    assert code == 404
    code, _ = await _api(jp_fetch, "DELETE", f"clusters/{cid}")
    assert code == 404


async def test_cluster_limit_is_409(jp_fetch: Any, manager: ClusterManager) -> None:
    manager.max_clusters = 1
    code, _ = await _api(jp_fetch, "POST", "clusters", {"num_cpus": 1, "nodes": 1})
    assert code == 201
    r = await _fetch(
        jp_fetch, "nbcluster", "api", "clusters", method="POST", body='{"num_cpus": 1, "nodes": 1}'
    )
    assert r.code == 409
    assert "stop one first" in _assert_error_body(r)["message"]


async def test_cluster_of_another_process_is_listed_not_controlled(
    jp_fetch: Any, manager: ClusterManager, cluster_temp_dir: Path
) -> None:
    """A cluster started elsewhere on this host: listed with its load, never scaled/stopped."""
    cluster = LocalCluster(num_cpus=1, temp_dir=str(cluster_temp_dir)).start()
    try:
        code, listing = await _api(jp_fetch, "GET", "clusters")
        (entry,) = listing["clusters"]
        assert entry["origin"] == "host" and entry["address"] == cluster.address
        assert entry["owner_pid"] == os.getpid() and entry["nodes"] == 1
        assert not entry["can_scale"] and not entry["can_stop"] and not entry["can_forget"]
        code, load = await _api(jp_fetch, "GET", f"clusters/{entry['id']}/load")
        assert code == 200 and load["cpu_total"] == 1.0
        for method, body in (("PATCH", {"nodes": 2}), ("DELETE", None)):
            r = await _fetch(
                jp_fetch,
                "nbcluster",
                "api",
                "clusters",
                entry["id"],
                method=method,
                **({"body": json.dumps(body)} if body else {}),
            )
            assert r.code == 409
            assert f"PID {os.getpid()}" in _assert_error_body(r)["message"]
        assert cluster.head is not None and cluster.head.poll() is None  # still running
    finally:
        session = cluster.session_dir
        cluster.stop()
    assert_no_processes(session)
    code, listing = await _api(jp_fetch, "GET", "clusters")
    assert listing["clusters"] == []


async def test_added_address_is_listed_and_forgotten(
    jp_fetch: Any, manager: ClusterManager
) -> None:
    code, entry = await _api(jp_fetch, "POST", "addresses", {"address": "[::1]:6379"})
    assert code == 201
    assert entry["origin"] == "address" and entry["can_forget"] and not entry["can_stop"]
    assert entry["nodes"] is None and entry["session_dir"] is None
    code, load = await _api(jp_fetch, "GET", f"clusters/{entry['id']}/load")
    assert code == 200 and load["source"] == "none" and load["cpu_total"] is None
    code, cc = await _api(jp_fetch, "POST", f"clusters/{entry['id']}/connect-code", {})
    assert cc["code"].endswith("%cluster connect [::1]:6379")
    r = await _fetch(
        jp_fetch, "nbcluster", "api", "clusters", entry["id"], method="PATCH", body='{"nodes": 2}'
    )
    assert r.code == 409
    code, _ = await _api(jp_fetch, "DELETE", f"clusters/{entry['id']}")
    assert code == 204
    code, listing = await _api(jp_fetch, "GET", "clusters")
    assert listing["clusters"] == []


async def test_server_stop_stops_panel_clusters(
    jp_fetch: Any, jp_serverapp: Any, manager: ClusterManager
) -> None:
    """The extension's stop hook (server shutdown) ends the clusters the panel started."""
    code, created = await _api(jp_fetch, "POST", "clusters", {"num_cpus": 1, "nodes": 2})
    assert code == 201
    (app,) = jp_serverapp.extension_manager.extension_apps["nbcluster.jupyter.server"]
    await app.stop_extension()
    assert_no_processes(created["session_dir"], timeout=15)
    assert manager.owned_clusters() == {}


async def test_added_address_is_never_contacted(jp_fetch: Any, manager: ClusterManager) -> None:
    """S06: the server makes no request to an address the user gave (no SSRF)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        code, entry = await _api(jp_fetch, "POST", "addresses", {"address": address})
        assert code == 201 and entry["origin"] == "address"
        for method, suffix in (("GET", ""), ("GET", "/load"), ("POST", "/connect-code")):
            code, _ = await _api(jp_fetch, method, f"clusters/{entry['id']}{suffix}", None)
            assert code == 200
        code, _ = await _api(jp_fetch, "GET", "clusters")
        with pytest.raises(BlockingIOError):
            listener.accept()


async def test_cluster_started_by_a_kernel_of_this_server(
    jp_fetch: Any, jp_serverapp: Any, manager: ClusterManager, cluster_temp_dir: Path
) -> None:
    """A kernel of this server runs ``nbcluster.init()``: listed as origin "kernel" with its
    kernel id, not controllable from the panel, and gone when the kernel is shut down."""
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(r.body)["id"]
    kernel = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    client = kernel.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        code = (
            "import os\n"
            f"os.environ['NBCLUSTER_TEMP_DIR'] = {str(cluster_temp_dir)!r}\n"
            "import nbcluster\n"
            "nbcluster.init(num_cpus=1)\n"
        )
        reply = await client.execute_interactive(code, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        code_, listing = await _api(jp_fetch, "GET", "clusters")
        (entry,) = listing["clusters"]
        assert entry["origin"] == "kernel" and entry["kernel_id"] == kernel_id
        assert not entry["can_stop"] and not entry["can_scale"]
        code_, load = await _api(jp_fetch, "GET", f"clusters/{entry['id']}/load")
        assert code_ == 200 and load["cpu_total"] == 1.0
    finally:
        client.stop_channels()
    r = await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert r.code == 204
    assert_no_processes(entry["session_dir"], timeout=30)
    code_, listing = await _api(jp_fetch, "GET", "clusters")
    assert listing["clusters"] == []
