"""Peer-to-peer catch-up: a healthy rank serves its state, a restarted one fetches it.

The sending rank copies its tensors at a step boundary (a memory copy: the only time its
training loop waits), then a background thread serialises the copy and an HTTP server
thread serves it in fixed-size chunks, each with its SHA-256, at a bounded rate so the
sender's own step time barely moves. Every thread of the server (accepting, serving,
serialising, hashing) runs ``serve_nice`` nice levels below the thread that trains
(``ft_runtime.priority``), so on a busy machine the scheduler gives the training loop the
CPU first; a system that refuses the lower priority only costs that advantage. The
receiver verifies every chunk (and retries a bad one), then loads the whole with
``torch.load(weights_only=True)``.

Authentication, when the server has a token (the job's catch-up token): the token itself
never crosses the network. Each request carries a fresh nonce and a proof (an HMAC of the
nonce and the path under the token); the server refuses a request without a valid proof
or with a nonce it has seen, and signs each answer (an HMAC of the nonce and the body's
SHA-256), so the joiner uses nothing from an address that cannot prove it knows the token:
a process that took over the source's port, or a forged address, gets no token and feeds
the joiner nothing.

Endpoints (loopback by default)::

    GET /snapshot/<tag>/meta        {"tag", "step", "bytes", "chunk_bytes", "sha256": [...]}
    GET /snapshot/<tag>/chunk/<i>   the i-th chunk
    GET /log/<step>                 the update the sender applied at that step (its SHA-256
                                    in the X-SHA256 header), so a receiver can replay the
                                    steps trained since the snapshot; the training loop
                                    only copies it, a serving thread encodes it on request
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from ft_runtime.errors import CatchUpError
from ft_runtime.priority import lower_this_thread, thread_nice

CHUNK_BYTES = 4 << 20
SERVE_NICE = 10
"""Nice levels the server's threads run below the thread that created the server."""
AUTH_SCHEME = "EE-Proof"
NONCES_KEPT = 65536
"""Nonces a server remembers to refuse a replayed request."""


def proof(token: str, role: str, *parts: str) -> str:
    """HMAC-SHA256 (hex) of ``role`` and ``parts`` under ``token``: what each side shows
    to prove it knows the token without sending it."""
    message = "\n".join((role, *parts)).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


class _Snapshot:
    def __init__(self, tag: str, step: int, state: Mapping[str, Any], chunk_bytes: int) -> None:
        self.tag, self.step, self.chunk_bytes = tag, step, chunk_bytes
        self.ready = threading.Event()
        self.payload = b""
        self.digests: list[str] = []
        self._state = state

    def serialise(self, lower: Callable[[], None]) -> None:
        lower()
        buffer = io.BytesIO()
        torch.save(dict(self._state), buffer)
        self.payload = buffer.getvalue()
        self._state = {}
        size = self.chunk_bytes
        self.digests = [
            hashlib.sha256(self.payload[i : i + size]).hexdigest()
            for i in range(0, max(1, len(self.payload)), size)
        ]
        self.ready.set()

    def meta(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "step": self.step,
            "bytes": len(self.payload),
            "chunk_bytes": self.chunk_bytes,
            "sha256": self.digests,
        }


class LoggedUpdate:
    """One step's update as the training loop left it (a copy); a serving thread encodes
    and hashes it on the first request, so the training loop never serialises."""

    def __init__(self, update: torch.Tensor, lr: float) -> None:
        self._entry: dict[str, Any] = {"update": update.detach().clone(), "lr": lr}
        self._lock = threading.Lock()
        self._body = b""
        self._digest = ""

    def encoded(self) -> tuple[bytes, str]:
        """The entry as ``fetch_update`` reads it, and its SHA-256."""
        with self._lock:
            if not self._digest:
                self._body = encode_update(self._entry)
                self._digest = hashlib.sha256(self._body).hexdigest()
                self._entry = {}
            return self._body, self._digest


class SnapshotServer:
    """Serves this rank's snapshots to recovering peers. Never raises into training.

    Args:
        host: address to bind (loopback unless told otherwise).
        rate_bytes_s: upper bound of the bytes per second sent (all requests together).
        token: when not empty, every request must prove it knows it, and every answer
            proves the server does (the token is never sent).
        chunk_bytes: size of one chunk.
        serve_nice: how many nice levels below the creating thread (the training loop)
            the server's threads run; 0 keeps them at its priority. A negative value
            raises their priority, which needs the privilege to do so.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        rate_bytes_s: float = 200e6,
        token: str = "",
        chunk_bytes: int = CHUNK_BYTES,
        serve_nice: int = SERVE_NICE,
    ) -> None:
        self.rate_bytes_s = rate_bytes_s
        self.token = token
        self.chunk_bytes = chunk_bytes
        self.nice_target = thread_nice() + serve_nice
        self.refused = False  # the system refused the priority: the threads run unlowered
        self.snapshots: dict[str, _Snapshot] = {}
        self.log: dict[int, LoggedUpdate] = {}
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._next_send = 0.0
        self._nonces: set[str] = set()
        self._nonce_order: deque[str] = deque()
        self._server = _LoweredHTTPServer((host, 0), _handler(self), self.lower_priority)
        threading.Thread(target=self._serve, daemon=True, name="snapshots").start()

    def _serve(self) -> None:
        self.lower_priority()
        self._server.serve_forever()

    def lower_priority(self) -> None:
        """Puts the calling thread (one of the server's) at ``nice_target``; a refusal is
        logged once and serving goes on at the thread's priority."""
        if lower_this_thread(self.nice_target, warn=not self.refused) is None:
            self.refused = True

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def publish(self, tag: str, step: int, state: Mapping[str, Any]) -> None:
        """Copies ``state`` now (tensors cloned) and serves it as ``tag`` once serialised."""
        copied = {k: _copy(v) for k, v in state.items()}
        snapshot = _Snapshot(tag, step, copied, self.chunk_bytes)
        self.snapshots = {tag: snapshot}  # only the newest is kept: memory stays bounded
        threading.Thread(
            target=snapshot.serialise, args=(self.lower_priority,), daemon=True, name="serialise"
        ).start()

    def log_update(self, step: int, update: torch.Tensor, lr: float) -> None:
        """Keeps the update applied at ``step`` for a joiner's replay (a copy; encoded by
        the serving thread that first sends it)."""
        self.log[step] = LoggedUpdate(update, lr)

    def throttle(self, nbytes: int) -> None:
        """Blocks the sending thread so that the rate stays under ``rate_bytes_s``."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_send)
            self._next_send = start + nbytes / self.rate_bytes_s
            self.bytes_sent += nbytes
        if start > now:
            time.sleep(start - now)

    def fresh(self, nonce: str) -> bool:
        """Whether ``nonce`` is new (then it is remembered): a replayed request is not."""
        with self._lock:
            if nonce in self._nonces:
                return False
            self._nonces.add(nonce)
            self._nonce_order.append(nonce)
            if len(self._nonce_order) > NONCES_KEPT:
                self._nonces.discard(self._nonce_order.popleft())
            return True

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _LoweredHTTPServer(ThreadingHTTPServer):
    """One thread per request, each at the server's lowered priority."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        lower: Callable[[], None],
    ) -> None:
        super().__init__(address, handler)
        self.lower = lower

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        threading.current_thread().name = "catchup-serve"
        self.lower()
        super().process_request_thread(request, client_address)


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy(v) for v in value)
    return value


def _handler(server: SnapshotServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.nonce = self.headers.get("X-EE-Nonce", "")
            if server.token and not self._authentic():
                self.send_error(401, "missing, wrong or replayed proof of the job's token")
                return
            parts = self.path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "log" and parts[1].isdigit():
                entry = server.log.get(int(parts[1]))
                if entry is None:
                    self.send_error(404, f"no update logged for step {parts[1]}")
                else:
                    body, digest = entry.encoded()
                    server.throttle(len(body))
                    self._send(body, digest)
                return
            if len(parts) < 3 or parts[0] != "snapshot" or parts[1] not in server.snapshots:
                self.send_error(404, f"no snapshot at {self.path}")
                return
            snapshot = server.snapshots[parts[1]]
            if not snapshot.ready.wait(timeout=60):
                self.send_error(503, "snapshot not serialised yet")
                return
            if parts[2] == "meta":
                meta = json.dumps(snapshot.meta()).encode()
                self._send(meta, hashlib.sha256(meta).hexdigest())
                return
            index = int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else -1
            if not 0 <= index < len(snapshot.digests):
                self.send_error(404, f"no chunk {parts[3:]}")
                return
            size = snapshot.chunk_bytes
            chunk = snapshot.payload[index * size : (index + 1) * size]
            server.throttle(len(chunk))
            self._send(chunk, snapshot.digests[index])

        def _authentic(self) -> bool:
            given = self.headers.get("Authorization", "")
            want = f"{AUTH_SCHEME} {proof(server.token, 'request', self.nonce, self.path)}"
            ok = len(self.nonce) == 32 and hmac.compare_digest(given.encode(), want.encode())
            return ok and server.fresh(self.nonce)

        def _send(self, body: bytes, digest: str) -> None:
            """Sends ``body`` with the SHA-256 it should have, and the proof over both."""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-SHA256", digest)
            if server.token:
                answer = proof(server.token, "response", self.nonce, digest)
                self.send_header("X-EE-Proof", answer)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # one line per chunk would flood the rank's log

    return Handler


def fetch_snapshot(
    address: str, tag: str, token: str = "", timeout_s: float = 60.0, retries: int = 3
) -> tuple[int, dict[str, Any]]:
    """Fetches and verifies a peer's snapshot; returns (step, state).

    Raises:
        CatchUpError: the peer is unreachable, or a chunk stays corrupt after ``retries``.
    """
    base = f"http://{address}/snapshot/{tag}"
    body, digest = _get(f"{base}/meta", token, timeout_s)
    if hashlib.sha256(body).hexdigest() != digest:
        raise CatchUpError(f"the meta of snapshot {tag} from {address} fails its checksum")
    meta = _meta(body, f"snapshot {tag} from {address}")
    payload = bytearray()
    for index, digest in enumerate(meta["sha256"]):
        for _attempt in range(retries):
            chunk = _get(f"{base}/chunk/{index}", token, timeout_s)[0]
            if hashlib.sha256(chunk).hexdigest() == digest:
                payload += chunk
                break
        else:
            raise CatchUpError(f"chunk {index} of snapshot {tag} from {address} stays corrupt")
    if len(payload) != meta["bytes"]:
        raise CatchUpError(f"snapshot {tag}: got {len(payload)} bytes, expected {meta['bytes']}")
    state = load_state(bytes(payload), f"snapshot {tag} from {address}")
    return int(meta["step"]), state


def fetch_update(address: str, step: int, token: str = "") -> dict[str, Any] | None:
    """The update a peer applied at ``step``, or None while it has not logged it yet.

    Raises:
        CatchUpError: the peer is unreachable or the entry fails its checksum.
    """
    url = f"http://{address}/log/{step}"
    try:
        body, digest = _request(url, token, 30.0)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise CatchUpError(f"cannot fetch update {step} from {address}: {exc}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise CatchUpError(f"cannot fetch update {step} from {address}: {exc}") from exc
    if hashlib.sha256(body).hexdigest() != digest:
        raise CatchUpError(f"update {step} from {address} fails its checksum")
    return load_state(body, f"update {step} from {address}", map_location=None)


def load_state(payload: bytes, what: str, map_location: str | None = "cpu") -> dict[str, Any]:
    """Tensors and plain data from a peer (``weights_only``: never arbitrary objects).

    Raises:
        CatchUpError: the bytes are not such a state (any unpickling error included).
    """
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location=map_location)
    except Exception as exc:  # the unpickler's errors have no common base
        raise CatchUpError(f"{what} cannot be loaded: {type(exc).__name__}: {exc}"[:500]) from None
    if not isinstance(state, dict):
        raise CatchUpError(f"{what} holds {type(state).__name__}, not a dict")
    return state


def _meta(body: bytes, what: str) -> dict[str, Any]:
    """A snapshot's meta: its step, size and chunk digests; CatchUpError when malformed."""
    try:
        meta = json.loads(body)
        ok = (
            isinstance(meta, dict)
            and isinstance(meta.get("step"), int)
            and isinstance(meta.get("bytes"), int)
            and isinstance(meta.get("sha256"), list)
            and all(isinstance(d, str) for d in meta["sha256"])
        )
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise CatchUpError(f"{what}: malformed meta (want step, bytes and sha256 digests)")
    return dict(meta)


def encode_update(update: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(dict(update), buffer)
    return buffer.getvalue()


def _get(url: str, token: str, timeout_s: float) -> tuple[bytes, str]:
    try:
        return _request(url, token, timeout_s)
    except (urllib.error.URLError, OSError) as exc:
        raise CatchUpError(f"cannot fetch {url}: {exc}") from exc


def _request(url: str, token: str, timeout_s: float) -> tuple[bytes, str]:
    """The body and X-SHA256 of ``url`` (the caller compares the two). With a token the
    request proves it knows it (the token is not sent) and the answer must prove the same
    over the nonce and that digest, or CatchUpError: nothing from a server that cannot is
    used."""
    request = urllib.request.Request(url)
    nonce = secrets.token_hex(16)
    if token:
        path = urllib.parse.urlsplit(url).path
        request.add_header("X-EE-Nonce", nonce)
        request.add_header("Authorization", f"{AUTH_SCHEME} {proof(token, 'request', nonce, path)}")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        body = bytes(response.read())
        digest = response.headers.get("X-SHA256", "")
        answer = response.headers.get("X-EE-Proof", "")
    if token:
        want = proof(token, "response", nonce, digest)
        if not hmac.compare_digest(answer.encode(), want.encode()):
            host = urllib.parse.urlsplit(url).netloc
            raise CatchUpError(
                f"the catch-up source at {host} cannot prove it knows the job's token; "
                "nothing it sent is used (another process may hold its port)"
            )
    return body, digest
