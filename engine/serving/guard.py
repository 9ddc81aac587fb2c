"""What keeps web pages from driving the server: the Host and Origin checks, and JSON only.

A page in the user's browser can send requests to 127.0.0.1 like any other site. Three gates
stop it, and none of them touches a client that is not a browser (the openai package, curl,
editors send the Host they dialled, no Origin, and ``application/json``):

- Host: DNS rebinding points a name the page controls at 127.0.0.1, so the page's requests
  become same-origin and it could read the replies; they still carry that name as Host. Only
  the names the server was bound to are answered (403 otherwise).
- Origin: a browser names the page behind every cross-origin request (and same-origin POSTs).
  A request whose Origin is neither the server's own nor a ``--cors-origin`` is refused (403).
- Content-Type: the bodies a page may POST without a CORS preflight are ``text/plain``, forms
  and multipart; the JSON routes take ``application/json`` only (415 otherwise), so every
  cross-origin JSON POST needs a preflight, which gets no CORS approval unless configured.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.serving.schemas import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


def host_name(host: str) -> str:
    """The name part of a Host header or a bind address: no port, no brackets, lower case,
    no trailing dot ("[::1]:8080" -> "::1", "LocalHost.:80" -> "localhost")."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:  # name:port; more colons is a bare IPv6 address
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class HostPolicy:
    """Which Host and Origin values a request may carry.

    Host: the loopback names, the bound address or name, and ``extra_hosts`` (``"*"``: any).
    Bound to every address (0.0.0.0, ::), any IP literal is one of the machine's own: rebinding
    needs a name, so IP literals are safe to answer there; names still need ``extra_hosts``.
    Origin: absent, the server's own (``scheme://Host``), or one of ``cors_origins``.
    """

    bind_host: str = "127.0.0.1"
    extra_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()

    def allows_host(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        if "*" in self.extra_hosts:
            return True
        name = host_name(header)
        if name in LOOPBACK_NAMES or name == host_name(self.bind_host):
            return True
        if name in {host_name(h) for h in self.extra_hosts}:
            return True
        return self.bind_host in WILDCARD_BINDS and _is_ip(name)

    def allows_origin(self, origin: str | None, host: str | None) -> bool:
        if origin is None:
            return True
        origin = origin.strip().lower().rstrip("/")
        if "*" in self.cors_origins or origin in {o.lower().rstrip("/") for o in self.cors_origins}:
            return True
        return host is not None and origin in (f"http://{host.lower()}", f"https://{host.lower()}")


class BrowserGuard:
    """ASGI middleware: 403 in OpenAI's error shape for a foreign Host or Origin. Outermost, so
    that neither CORS nor any route sees such a request."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host, origin = headers.get("host"), headers.get("origin")
        if not self.policy.allows_host(host):
            error = ApiError(403, f"the Host {host!r} is not one this server answers to: it is bound to "
                                  f"{self.policy.bind_host}; name other hosts with --allowed-host",
                             type="permission_error", code="host_not_allowed")
        elif not self.policy.allows_origin(origin, host):
            error = ApiError(403, f"requests from web pages at {origin!r} are not allowed: name the origin "
                                  "with --cors-origin to allow them", type="permission_error",
                             code="origin_not_allowed")
        else:
            await self.app(scope, receive, send)
            return
        await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)


def require_json(request: Request) -> None:
    """415 unless the body is declared ``application/json`` (a charset, if given, UTF-8): what
    every OpenAI client sends, and what a page cannot send cross-origin without a preflight."""
    declared = request.headers.get("content-type", "")
    media_type, *params = [part.strip().lower() for part in declared.split(";")]
    charset = next((p.partition("=")[2].strip('"') for p in params if p.startswith("charset=")), "utf-8")
    if media_type != "application/json" or charset not in ("utf-8", "utf8"):
        raise ApiError(415, f"the body must be JSON sent as 'Content-Type: application/json', not {declared!r}",
                       code="unsupported_media_type")
