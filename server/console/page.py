"""The console's web server (``coordinator serve --console HOST:PORT``): a read-only page of the
studies, served by the standard library's threading HTTP server (HTTPS with the coordinator's
own certificate and key when it serves TLS; plain HTTP with ``--insecure``).

Every page needs the operator token, given either as ``Authorization: Bearer <token>`` on each
request or once in the login form (``POST /login``, the token in the body), which opens a
session: a random id in an ``HttpOnly; SameSite=Strict`` cookie (``Secure`` over HTTPS), kept in
memory for :data:`SESSION_SECONDS` (a restart logs everyone out). A token in the URL is never
read. Without a credential a page answers 401 with the login form, with a wrong one 403; the
token is checked as the Operator service checks it (SHA-256, constant-time comparison).

Routes: ``GET /`` (studies and the audit trail), ``GET /study/<id>`` (:mod:`.views`),
``GET|POST /login``, ``POST /logout``; nothing else (404). Every answer forbids caching, framing,
sniffing and scripts (:data:`HEADERS`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import ssl
import threading
import time
from collections.abc import Callable
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from fedsketch.server.console import views
from fedsketch.server.console.metrics import split_listen
from fedsketch.server.errors import Code, Refusal
from fedsketch.server.service.coordinator import Coordinator

log = logging.getLogger("fedsketch.coordinator")

#: How long a login lasts (seconds), the most sessions kept (the oldest goes first), the cookie.
SESSION_SECONDS, MAX_SESSIONS, COOKIE = 12 * 3600.0, 1000, "fedsketch_console"
#: The largest login form body read (bytes); seconds a connection may stall (its TLS handshake
#: included) before it is dropped.
MAX_FORM_BYTES, REQUEST_SECONDS = 4096, 30.0
#: Headers of every answer.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Sessions:
    """Logged-in sessions: random ids with their expiry (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expiry: dict[str, float] = {}

    def open(self) -> str:
        session = secrets.token_urlsafe(32)
        with self._lock:
            if len(self._expiry) >= MAX_SESSIONS:
                del self._expiry[min(self._expiry, key=self._expiry.__getitem__)]
            self._expiry[session] = time.monotonic() + SESSION_SECONDS
        return session

    def valid(self, session: str) -> bool:
        with self._lock:
            expiry = self._expiry.get(session)
            if expiry is not None and expiry < time.monotonic():
                del self._expiry[session]
                expiry = None
        return expiry is not None

    def close(self, session: str) -> None:
        with self._lock:
            self._expiry.pop(session, None)


def make_handler(c: Coordinator, token_sha256: str, secure: bool) -> type[BaseHTTPRequestHandler]:
    """The request handler class of one console."""
    sessions = Sessions()

    def token_ok(token: str) -> bool:
        return hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), token_sha256)

    class Handler(BaseHTTPRequestHandler):
        server_version = "fedsketch-console"
        sys_version = ""
        timeout = REQUEST_SECONDS  # a client that stalls loses its connection, not a thread

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
            log.debug("console: " + format, *args)

        def _send(self, status: int, body: str = "", headers: dict[str, str] | None = None) -> None:
            data = body.encode()
            self.send_response(status)
            for name, value in {**HEADERS, **(headers or {})}.items():
                self.send_header(name, value)
            if body:
                self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _session(self) -> str:
            cookie = SimpleCookie()
            try:
                cookie.load(self.headers.get("Cookie", ""))
            except Exception:  # noqa: BLE001 - a malformed cookie is no session
                return ""
            return cookie[COOKIE].value if COOKIE in cookie else ""

        def _authorized(self) -> bool:
            """True if the request carries the operator token or a live session; otherwise the
            refusal (401 with the form, or 403) has been sent."""
            header = self.headers.get("Authorization", "")
            if header:
                if header.startswith("Bearer ") and token_ok(header[len("Bearer "):]):
                    return True
                self._send(403, views.login_page("bad operator credential"))
                return False
            if sessions.valid(self._session()):
                return True
            self._send(401, views.login_page(), {"WWW-Authenticate": 'Bearer realm="fedsketch"'})
            return False

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            path = urlsplit(self.path).path
            if path == "/login":
                return self._send(200, views.login_page())
            if not (path == "/" or path.startswith("/study/")):
                return self._send(404, views.document("Not found", "<p>No such page.</p>", False))
            if not self._authorized():
                return None
            self._render(lambda: views.front_page(c) if path == "/"
                         else views.study_page(c, unquote(path[len("/study/"):])))

        def _render(self, page: Callable[[], str]) -> None:
            try:
                body = page()
            except Refusal as exc:
                status = 404 if exc.code == Code.NOT_FOUND else 400
                return self._send(status, views.document("Refused", f"<p>{views.esc(exc.message)}</p>"))
            except Exception:  # a sick store or a bug: logged, never shown
                error_id = secrets.token_hex(4)
                log.exception("console: internal error %s", error_id)
                return self._send(500, views.document("Error", f"<p>internal error {error_id}; see "
                                                      "the coordinator's log</p>"))
            self._send(200, body)

        def do_POST(self) -> None:  # noqa: N802 - the base class's name
            path = urlsplit(self.path).path
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit() or int(length) > MAX_FORM_BYTES:
                return self._send(413, views.login_page("request too large"))
            form = parse_qs(self.rfile.read(int(length)).decode("utf-8", "replace"))
            if path == "/logout":
                sessions.close(self._session())
                return self._send(303, headers={"Location": "/login", "Set-Cookie": _cookie("", 0, secure)})
            if path != "/login":
                return self._send(404, views.document("Not found", "<p>No such page.</p>", False))
            if not token_ok(form.get("token", [""])[0]):
                return self._send(403, views.login_page("wrong operator token"))
            session = sessions.open()
            self._send(303, headers={"Location": "/", "Set-Cookie": _cookie(session, SESSION_SECONDS,
                                                                              secure)})

    return Handler


def _cookie(value: str, seconds: float, secure: bool) -> str:
    return (f"{COOKIE}={value}; Path=/; Max-Age={int(seconds)}; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else ""))


class ConsoleServer(ThreadingHTTPServer):
    """The standard threading server, each connection on a daemon thread; a connection that
    fails (a client gone, a failed TLS handshake) is logged in one line, not with a traceback."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        log.debug("console: connection from %s failed", client_address[0], exc_info=True)


def serve_console(listen: str, c: Coordinator, token_sha256: str,
                  tls: tuple[Path, Path] | None) -> tuple[int, Callable[[], None]]:
    """Serve the console on ``listen`` (HOST:PORT; port 0 picks one) on a thread; ``tls`` the
    (certificate, key) files for HTTPS. Returns (bound port, stop function)."""
    host, port = split_listen(listen, "--console", allow_zero=True)
    server = ConsoleServer((host, port), make_handler(c, token_sha256, tls is not None))
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls[0], tls[1])
        # the handshake runs on the connection's own thread (its first read), under its timeout,
        # so a client that stalls it cannot hold up the accepting thread
        server.socket = context.wrap_socket(server.socket, server_side=True,
                                            do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, name="console", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return server.server_address[1], stop
