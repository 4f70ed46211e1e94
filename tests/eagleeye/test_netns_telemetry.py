"""Telemetry off loopback, between two hosts (network namespaces on a bridge): the
receiver binds the controller host's own address, the sender on the other host signs with
the shared secret read from a file; an unsigned and a forged message are refused, logged
and never delivered; nothing is left running in either namespace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns import NetHosts, need_netns

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECEIVER = """
import json, sys, time
from pathlib import Path
from collector.transport import TelemetryReceiver
address, secret = sys.argv[1], Path(sys.argv[2]).read_text().strip().encode()
receiver = TelemetryReceiver(address, key=secret)
print("ready", flush=True)
names, deadline = [], time.time() + 60
# every message, whatever order its connection delivered it in: two taken, two refused
while (len(names) < 2 or sum(receiver.rejected.values()) < 2) and time.time() < deadline:
    names += [s.name for s in receiver.receive(timeout_s=0.2)]
print(json.dumps({"names": names, "rejected": dict(receiver.rejected)}), flush=True)
receiver.close()
"""

SENDER = """
import sys, time
from pathlib import Path
from collector.transport import TelemetryPublisher
address, secret = sys.argv[1], Path(sys.argv[2]).read_text().strip().encode()
for name, key in (("ok", secret), ("unsigned", None), ("forged", b"a guess"), ("done", secret)):
    publisher = TelemetryPublisher(address, key=key)
    publisher.send({"rank": "0", "node": "node1"}, [[name, 1.0, time.time(), 0]])
    publisher.close()  # waits until the message is delivered
"""


def test_telemetry_between_hosts_is_authenticated_by_the_shared_secret(tmp_path: Path) -> None:
    need_netns()
    secret = tmp_path / "secret"
    secret.write_text("a shared secret of the job\n")
    with NetHosts(2) as hosts:
        address = f"tcp://{hosts.addresses[0]}:5701"
        receiver = hosts.popen(
            0,
            [sys.executable, "-c", RECEIVER, address, str(secret)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        sender = hosts.popen(1, [sys.executable, "-c", SENDER, address, str(secret)])
        assert sender.wait(timeout=60) == 0
        out, err = receiver.communicate(timeout=60)
        names = list(hosts.names)
    got = json.loads(out.strip().splitlines()[-1])
    assert sorted(got["names"]) == ["done", "ok"]  # the unsigned and the forged never arrive
    assert got["rejected"] == {"auth": 2}
    assert "dropped telemetry from" in err  # refused and logged
    for name in names:  # the namespaces are gone with whatever ran in them
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        assert name not in listed.stdout
