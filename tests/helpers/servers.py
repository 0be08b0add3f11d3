"""Real servers for tests, on 127.0.0.1: nginx, moto's S3 server, ``xetfs serve`` and a fault-injecting proxy.

Each runs on a free port, is polled until it answers (with a deadline,
failing loudly with its log if it dies), and is always stopped when its
``with`` block ends.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEADLINE = 20.0
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(port: int, proc: subprocess.Popen[bytes] | None, log: Path | None, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            pass
        text = log.read_text(errors="replace") if log and log.exists() else ""
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}:\n{text}")
        if time.monotonic() > end:
            raise RuntimeError(f"{what} did not answer on port {port} within {DEADLINE} s:\n{text}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class Server:
    url: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def access_log(self) -> str:
        return self.log.with_name("access.log").read_text(errors="replace") if self.log else ""

    def log_mark(self) -> int:
        """Where the access log ends now: ``bytes_sent(since=...)`` counts what comes after."""
        path = self.log.with_name("access.log") if self.log else None
        return path.stat().st_size if path is not None and path.exists() else 0

    def bytes_sent(self, *, since: int = 0, under: str = "") -> tuple[int, int]:
        """Body bytes nginx sent, and its requests, for paths containing ``under``, from log offset ``since``
        on (nginx's combined log format: the size follows the status)."""
        text = self.access_log().encode(errors="replace")[since:].decode(errors="replace")
        sent = requests = 0
        for m in re.finditer(r'"[A-Z]+ (\S+) [^"]*" (\d{3}) (\d+)', text):
            if under in m.group(1):
                sent += int(m.group(3))
                requests += 1
        return sent, requests

    def requests_since(self, since: int) -> list[tuple[str, str]]:
        """``(method, path)`` of every request nginx logged from log offset ``since`` on."""
        text = self.access_log().encode(errors="replace")[since:].decode(errors="replace")
        return [(m.group(1), m.group(2)) for m in re.finditer(r'"([A-Z]+) (\S+) [^"]*" \d{3}', text)]

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


def settled(top: Path) -> None:
    """Date a served directory's files a minute in the past, so that a server's tags of them (ETag, Last-Modified:
    whole seconds) are trusted at once (``TAG_SETTLE_SECONDS``)."""
    past = time.time() - 60
    for path in [top, *top.rglob("*")]:
        os.utime(path, (past, past))


# What every nginx of the tests has: one process, its files under {tmp}, a log of every request.
_NGINX_HEAD = """
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
"""

_NGINX_CONF = (
    _NGINX_HEAD
    + """    default_type application/octet-stream;
    sendfile on;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        {auth}
        location / {{ }}
    }}
}}
"""
)


@contextlib.contextmanager
def nginx(root: Path, *, token: str | None = None, port: int | None = None) -> Iterator[Server]:
    """nginx serving the directory ``root`` (as a plain static server); with ``token``, only to
    requests that carry ``Authorization: Bearer <token>``."""
    tmp = Path(tempfile.mkdtemp(prefix="xetfs-nginx-"))
    port = port or free_port()
    auth = f'if ($http_authorization != "Bearer {token}") {{ return 401; }}' if token else ""
    conf = tmp / "nginx.conf"
    conf.write_text(_NGINX_CONF.format(tmp=tmp, port=port, root=root, auth=auth))
    with _serving([NGINX, "-p", str(tmp), "-c", str(conf)], tmp, port, tmp / "error.log", "nginx") as server:
        yield server


_NGINX_BALANCER_CONF = (
    _NGINX_HEAD
    + """    log_format cached '$request_method $uri $status $upstream_cache_status';
    proxy_cache_path {tmp}/cache keys_zone=xorbs:8m;
    upstream backends {{ {servers} }}
    server {{
        listen 127.0.0.1:{port};
        access_log {tmp}/cache.log cached;
        location / {{
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
        location /xorbs/ {{
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            {cache}
        }}
    }}
}}
"""
)


@contextlib.contextmanager
def nginx_balancer(ports: list[int], *, port: int | None = None, cache: bool = False) -> Iterator[Server]:
    """nginx passing requests round-robin to the servers on ``ports`` of 127.0.0.1, as a load balancer would;
    with ``cache``, it keeps what ``/xorbs/`` answers for as long as they say.  ``Server.log`` is its error
    log; ``cache.log`` beside it has a line per request: method, path, status, cache status."""
    tmp = Path(tempfile.mkdtemp(prefix="xetfs-nginx-lb-"))
    port = port or free_port()
    servers = " ".join(f"server 127.0.0.1:{p};" for p in ports)
    conf = tmp / "nginx.conf"
    caching = "proxy_cache xorbs;" if cache else ""
    conf.write_text(_NGINX_BALANCER_CONF.format(tmp=tmp, port=port, servers=servers, cache=caching))
    with _serving([NGINX, "-p", str(tmp), "-c", str(conf)], tmp, port, tmp / "error.log", "nginx") as server:
        yield server


@contextlib.contextmanager
def _serving(cmd: list[str], tmp: Path, port: int, log: Path, what: str) -> Iterator[Server]:
    """Run ``cmd`` (a server on ``port``; its output to ``tmp/output``) until the block ends, then
    stop it and remove ``tmp``."""
    with open(tmp / "output", "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        _wait_http(port, proc, log, what)
        yield Server(f"http://127.0.0.1:{port}", port, proc, log)
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def xetfs_serve(store: str | Path, *args: str, port: int | None = None) -> Iterator[Server]:
    """``xetfs serve STORE ARGS`` on a free port of 127.0.0.1 (its log, at level info, in ``Server.log``)."""
    tmp = Path(tempfile.mkdtemp(prefix="xetfs-serve-"))
    port = port or free_port()
    cmd = [sys.executable, "-m", "xetfs", "serve", str(store), "--port", str(port), "--log-level", "info", *args]
    with _serving(cmd, tmp, port, tmp / "output", "xetfs serve") as server:
        yield server


@contextlib.contextmanager
def python_http_server(root: Path) -> Iterator[Server]:
    """Python's ``http.server`` serving ``root``: a real server that ignores ``Range`` (it sends whole files)."""
    tmp = Path(tempfile.mkdtemp(prefix="xetfs-pyhttp-"))
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)]
    with _serving(cmd, tmp, port, tmp / "output", "python -m http.server") as server:
        yield server


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


@contextlib.contextmanager
def moto_s3() -> Iterator[Server]:
    """moto's standalone S3-compatible server; ``S3_ENV`` plus ``AWS_ENDPOINT_URL`` reach it."""
    tmp = Path(tempfile.mkdtemp(prefix="xetfs-moto-"))
    port = free_port()
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with _serving(cmd, tmp, port, tmp / "output", "moto server") as server:
        yield server


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on the S3 server at ``endpoint`` (no error if it exists)."""
    conn = http.client.HTTPConnection("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))
    conn.request("PUT", f"/{bucket}")
    conn.getresponse().read()
    conn.close()


def requests_logged(server: Server, method: str) -> int:
    """How many ``method`` requests moto's server has logged so far (its access log, one line a request)."""
    return server.log.read_text(errors="replace").count(f'"{method} ') if server.log else 0


def upload_dir(bucket_url: str, endpoint: str, top: Path) -> None:
    """Copy the directory ``top`` as-is to ``bucket_url`` (``s3://bucket/prefix``), creating the bucket."""
    import obstore
    from obstore.store import S3Store

    env = {**S3_ENV, "AWS_ENDPOINT_URL": endpoint}
    make_bucket(endpoint, bucket_url.removeprefix("s3://").split("/")[0])
    store = S3Store.from_url(bucket_url, endpoint=endpoint, access_key_id=env["AWS_ACCESS_KEY_ID"],
                             secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                             client_options={"allow_http": True})  # fmt: skip
    for path in sorted(top.rglob("*")):
        if path.is_file():
            obstore.put(store, path.relative_to(top).as_posix(), path.read_bytes())


# -- the fault-injecting proxy ---------------------------------------------------------


@dataclass
class Faults:
    """What the proxy does to the next requests: one fault per request, in order, then pass-through.

    Faults: ``"503"``, ``"500"``, ``"429"`` (an error answer), ``"reset"`` (close
    without answering), ``"truncate"`` (half the body, then close),
    ``"slow"`` (the body in small pieces with pauses), ``"stall"`` (headers and
    part of the body, then nothing until ``release``).  ``stall_all`` stalls every request.
    ``delay``: every answer starts that many seconds late, as a server far away.
    """

    queue: deque[str] = field(default_factory=deque)
    stall_all: bool = False
    delay: float = 0.0
    released: threading.Event = field(default_factory=threading.Event)
    seen: list[str] = field(default_factory=list)  # faults applied, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self) -> str:
        with self.lock:
            fault = "stall" if self.stall_all else (self.queue.popleft() if self.queue else "")
            if fault:
                self.seen.append(fault)
            return fault

    def release(self) -> None:
        self.stall_all = False
        self.released.set()


class _ProxyHandler(socketserver.BaseRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        """Answer requests on one connection (kept alive, as nginx does) until a fault or the client closes it."""
        sock: socket.socket = self.request
        sock.settimeout(30)
        pending = b""
        while True:
            while b"\r\n\r\n" not in pending:
                part = sock.recv(65536)
                if not part:
                    return
                pending += part
            head, pending = pending.split(b"\r\n\r\n", 1)  # (GET requests: no body)
            if not self._answer(sock, head):
                return

    def _answer(self, sock: socket.socket, head: bytes) -> bool:
        """Answer one request; whether the connection may serve another."""
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        headers.pop("Connection", None)
        fault = self.server.faults.next()
        time.sleep(self.server.faults.delay)
        if fault in ("503", "500", "429"):
            sock.sendall(f"HTTP/1.1 {fault} Fault\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
            return False
        if fault == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            return False
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=30)
        upstream.request(method, target, headers=headers)
        response = upstream.getresponse()
        body = response.read()
        upstream.close()
        out = [f"HTTP/1.1 {response.status} {response.reason}"]
        hop = ("connection", "keep-alive", "transfer-encoding", "content-length")
        out += [f"{k}: {v}" for k, v in response.getheaders() if k.lower() not in hop]
        out += [f"Content-Length: {len(body)}", "", ""]
        sock.sendall("\r\n".join(out).encode("latin-1"))
        if fault == "truncate":
            sock.sendall(body[: len(body) // 2])
            return False
        if fault == "stall":
            sock.sendall(body[: len(body) // 4])
            self.server.faults.released.wait(60)
            return False
        if fault == "slow":
            step = max(1, len(body) // 8)
            for i in range(0, len(body), step):
                sock.sendall(body[i : i + step])
                time.sleep(0.02)
            return True
        sock.sendall(body)
        return True


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream_port: int, faults: Faults) -> None:
        self.upstream_port = upstream_port
        self.faults = faults
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


@contextlib.contextmanager
def fault_proxy(upstream: Server) -> Iterator[tuple[Server, Faults]]:
    """A proxy in front of ``upstream`` that applies ``Faults`` to the requests it forwards."""
    faults = Faults()
    server = _ProxyServer(upstream.port, faults)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        yield Server(f"http://127.0.0.1:{port}", port), faults
    finally:
        faults.release()
        server.shutdown()
        server.server_close()
        thread.join(10)


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}
