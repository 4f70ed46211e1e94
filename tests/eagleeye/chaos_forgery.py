"""Forged and malformed messages for the chaos harness, one method per endpoint of a run:
telemetry, holder RPC, the Alertmanager webhook, the metrics server and (replica mode) the
catch-up servers. Each counts what it sent in ``outcome.forged`` and what the endpoint
answered in ``outcome.endpoint_answers``, which ``check_invariants`` judges.

The catch-up servers are found where their peers find them (the quorum store, through
the replica protocol's key and message): the one place that follows the replica API.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING

import psutil
import zmq

from collector.transport import encode, sign
from ft_runtime.replica.protocol import ServerAddress, decode, key_address

if TYPE_CHECKING:
    from tests.eagleeye.chaos_harness import Outcome


class Forgeries:
    """Mixed into the harness's run, which provides these attributes."""

    job: str
    outcome: Outcome
    rng: random.Random
    metrics_port: int
    alerts_port: int
    controller: subprocess.Popen[str] | None

    def _rank_env(self) -> dict[str, str]:
        raise NotImplementedError

    def _ended(self) -> bool:
        raise NotImplementedError

    def _holders(self) -> list[psutil.Process]:
        raise NotImplementedError

    def _ended_soon(self, within_s: float = 10.0) -> bool:
        """Whether the run ends within ``within_s`` (a holder gone while the run goes on
        longer than that died of something else than the run's end)."""
        deadline = time.monotonic() + within_s
        while not self._ended():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def forge_telemetry(self) -> None:
        """Unsigned, wrongly signed and malformed messages, as a stranger on the host (who
        can read a rank's environment for the address, not for the key) sends them."""
        address = self._rank_env().get("EAGLEEYE_TELEMETRY")
        if not address:
            self.outcome.skipped.append("forge_telemetry (no address)")
            return
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(address)
        now = time.time()
        stall = encode({"rank": "0", "replica": "0"}, [["step_time", 0.1, 0.0, 1]])
        exit_ = encode({"rank": "1"}, [["exit_code", -9, now, 1]])
        for frames in (
            [stall],
            [stall, sign(b"not the key", stall)],
            [exit_, b"\0" * 32],
            [b'{"v": 1, "labels": {"replica": "x"}, "samples": [["loss", 1, 1, 1]]}'],
            [json.dumps({"v": 1, "samples": [["step_time", 1, now, 10**30]]}).encode()],
            [self.rng.randbytes(self.rng.randint(1, 300))],
            [b"{" * 100_000],
        ):
            push.send_multipart(frames)
            self.outcome.forged += 1
        push.close()

    def forge_holder(self) -> None:
        """Requests without the job's token (stop, alloc, list, backup) and malformed
        frames to every holder; each must answer an error and stay the same process."""
        ring = self._rank_env().get("EAGLEEYE_SNAPSHOT_RING", "")
        endpoints = [pair.split("=", 1)[1] for pair in ring.split(",") if "=" in pair]
        if not endpoints:
            self.outcome.skipped.append("forge_holder (no holders)")
            return
        before = {p.pid for p in self._holders()}
        ctx = zmq.Context.instance()
        poller = zmq.Poller()
        sockets = []
        for endpoint in endpoints:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
            sockets.append(sock)
            for frames in (
                [b"", json.dumps({"op": "stop"}).encode()],
                [b"", json.dumps({"op": "alloc", "step": 1, "size": 1 << 40}).encode()],
                [b"", json.dumps({"op": "list", "token": "guess"}).encode()],
                [b"", json.dumps({"op": "backup_begin", "token": 7}).encode()],
                [b"", b"[" * 100_000],
                [b"only one frame"],
                [b"", self.rng.randbytes(64), b"x"],
            ):
                sock.send_multipart(frames)
                self.outcome.forged += 1
        answered = 0
        deadline = time.monotonic() + 5.0  # a holder being restarted answers later or never
        while answered < 7 * len(sockets) and time.monotonic() < deadline:
            for sock, _ in poller.poll(timeout=200):
                reply = sock.recv_multipart()
                head = json.loads(reply[-1] if len(reply) == 2 else reply[1])
                assert head.get("ok") is False, head  # every forged request is refused
                answered += 1
        for sock in sockets:
            sock.close()
        self.outcome.endpoint_answers["holder"] = answered
        after = {p.pid for p in self._holders()}
        kept = before <= after
        # up to 5 s pass above: a run may end meanwhile and stop its holders
        ended = not kept and self._ended_soon()
        self.outcome.holder_pids_after_forgery.append((len(before), kept, ended))

    def _http(self, port: int, raw: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            with suppress(OSError):
                s.sendall(raw)
                s.shutdown(socket.SHUT_WR)
            out = b""
            with suppress(OSError):
                while chunk := s.recv(65536):
                    out += chunk
            return out

    def _forge_http(self, name: str, port: int, path: str, good: Callable[[], bool]) -> None:
        requests = [
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".encode(),
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{{}}".encode(),
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n".encode(),
            (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                "Content-Type: application/json\r\nContent-Length: 120\r\n\r\n"
                + json.dumps({"alerts": [{"status": "firing", "labels": {"alertname": "x"}}]})[
                    :120
                ].ljust(120)
            ).encode(),
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + self.rng.randbytes(200),
            self.rng.randbytes(self.rng.randint(1, 500)),
            b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 300 + b"\r\n",
        ]
        half_open = []
        for _ in range(40):  # connections that never send a byte
            with suppress(OSError):
                half_open.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for raw in requests:
            with suppress(OSError):
                self._http(port, raw)
            self.outcome.forged += 1
        for s in half_open:
            s.close()
        answers = good()
        for _ in range(2):  # a paused or loaded controller answers late; a broken one never
            if answers or self._ended():
                break
            time.sleep(2.0)
            answers = good()
        if answers or not self._ended():  # judged only while the run still serves it
            self.outcome.endpoint_answers[name] = int(answers)

    def forge_webhook(self) -> None:
        def refuses_a_stranger() -> bool:
            body = json.dumps({"alerts": [{"status": "firing", "labels": {"alertname": "X"}}]})
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.alerts_port}/alerts",
                data=body.encode(),
                headers={"Authorization": "Bearer guess", "Content-Type": "application/json"},
            )
            try:
                urllib.request.urlopen(request, timeout=10)
            except urllib.error.HTTPError as exc:
                return exc.code == 401
            except OSError:
                return False
            return False

        self._forge_http("webhook", self.alerts_port, "/alerts", refuses_a_stranger)

    def forge_metrics(self) -> None:
        def still_serves() -> bool:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    return b"eagleeye" in response.read()
            except OSError:
                return False

        self._forge_http("metrics", self.metrics_port, "/metrics", still_serves)

    def _catch_up_addresses(self) -> list[str]:
        """The ranks' catch-up servers, as their peers find them (published in the quorum
        store under ``addr/RANK``)."""
        env = self._rank_env()
        quorum = env.get("EAGLEEYE_QUORUM", "")
        if ":" not in quorum:
            return []
        from datetime import timedelta

        from torch.distributed import TCPStore

        host, port = quorum.rsplit(":", 1)
        found = []
        try:
            store = TCPStore(
                host, int(port), is_master=False, timeout=timedelta(seconds=3),
                wait_for_workers=False,
            )  # fmt: skip
        except Exception:
            return []
        for rank in range(int(env.get("WORLD_SIZE", "2"))):
            with suppress(Exception):
                if store.check([key_address(rank)]):
                    found.append(decode(ServerAddress, store.get(key_address(rank))).address)
        return found

    def forge_catch_up(self) -> None:
        """Requests without or with a wrong token, bad paths and garbage to every catch-up
        server; a stranger is refused (401) and nothing is served."""
        addresses = self._catch_up_addresses()
        if not addresses:
            self.outcome.skipped.append("forge_catch_up (no server published)")
            return
        refused = served = 0
        for address in addresses:
            port = int(address.rsplit(":", 1)[1])
            for path in ("/snapshot/w0/meta", "/log/1", "/snapshot/../../etc/passwd", "/x"):
                for header in ("", "Authorization: Bearer guess\r\n"):
                    raw = f"GET {path} HTTP/1.1\r\nHost: x\r\n{header}\r\n".encode()
                    reply = b""
                    with suppress(OSError):  # a killed rank's server is gone
                        reply = self._http(port, raw)
                    if reply:
                        status = reply.split(b" ", 2)[1:2]
                        refused += status == [b"401"]
                        served += status != [b"401"]
                    self.outcome.forged += 1
            with suppress(OSError):
                self._http(port, self.rng.randbytes(300))
            self.outcome.forged += 1
        self.outcome.endpoint_answers["catch_up_refused"] = refused
        self.outcome.endpoint_answers["catch_up_served"] = served
