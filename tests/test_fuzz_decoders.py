"""Hypothesis fuzz of every decoder of untrusted bytes: each raises only its declared
error (or returns a value), whatever it is given. The holder is fuzzed as a live process
and must answer every request and stay up."""

from __future__ import annotations

import json
import math
import pickle
import socket
import time

import zmq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from collector._wire import MalformedTelemetry, decode_message
from collector.errors import ParseError
from collector.nccl import load_flight_record
from collector.transport import TelemetryReceiver, encode
from eagleeye.alerting import AlertWebhook, decode_alerts
from ft_runtime.catchup import _meta, load_state
from ft_runtime.ckpt._rpc import decode as rpc_decode
from ft_runtime.errors import CatchUpError, CheckpointError, FaultSpecError
from ft_runtime.faults import parse_specs
from remediation.config import parse_policy
from remediation.errors import PolicyError

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
label_values = st.one_of(st.text(max_size=6), st.integers(-5, 2**70), st.floats(), st.none())
labels = st.dictionaries(
    st.sampled_from(["rank", "replica", "attempt", "node", "seq", "bytes", "op", "x", ""]),
    label_values,
    max_size=5,
)
rows = st.lists(
    st.lists(json_values, min_size=0, max_size=6)
    | st.tuples(
        st.text(max_size=10) | st.integers(),
        scalars,
        st.floats(allow_nan=True) | st.integers(-(2**70), 2**70) | st.text(max_size=3),
        st.none() | st.integers(-(2**70), 2**70) | st.floats() | st.booleans(),
    ).map(list),
    max_size=5,
)


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@FUZZ
@given(st.binary(max_size=300) | labels.flatmap(lambda lab: rows.map(lambda r: encode(lab, r))))
def test_telemetry_decoder_raises_only_malformed_telemetry(payload: bytes) -> None:
    try:
        samples = decode_message(payload, now=1e9, max_skew_s=300)
    except MalformedTelemetry:
        return
    for sample in samples:  # what passes is what the rest of Eagle Eye may rely on
        assert isinstance(sample.name, str)
        assert sample.name
        assert sample.step is None or 0 <= sample.step < 2**63
        assert abs(sample.time - 1e9) <= 300
        for key in ("rank", "replica", "attempt"):
            if key in sample.labels:
                assert 0 <= int(sample.labels[key]) < 2**63


def test_the_live_receiver_survives_fuzzed_frames() -> None:
    receiver = TelemetryReceiver(key=b"k" * 32, max_message_bytes=4096)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(receiver.address)

    @FUZZ
    @given(st.lists(st.binary(max_size=600), min_size=1, max_size=4))
    def send(frames: list[bytes]) -> None:
        push.send_multipart(frames)
        receiver.receive(timeout_s=0.0)

    try:
        send()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert receiver.receive(timeout_s=0.05) == []  # nothing unsigned gets through
    finally:
        push.close(linger=0)
        receiver.close()
    assert receiver.malformed > 0


@FUZZ
@given(st.binary(max_size=300) | json_values.map(_json_bytes))
def test_holder_rpc_decoder_raises_only_checkpoint_error(frame: bytes) -> None:
    try:
        assert isinstance(rpc_decode(frame), dict)
    except CheckpointError:
        pass


@FUZZ
@given(st.binary(max_size=400) | json_values.map(_json_bytes))
def test_catch_up_decoders_raise_only_catch_up_error(payload: bytes) -> None:
    for decode in (lambda: load_state(payload, "fuzz"), lambda: _meta(payload, "fuzz")):
        try:
            decode()
        except CatchUpError:
            pass


alert_labels = st.dictionaries(
    st.sampled_from(["kind", "alertname", "severity", "rank", "replica", "node", "gpu", "x"]),
    json_values | st.sampled_from(["hang", "critical", "warning", "7", "-1", "9" * 5000, ""]),
    max_size=6,
)
alerts = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["firing", "resolved"]) | json_values,
        "labels": alert_labels | json_values,
        "annotations": st.fixed_dictionaries(
            {}, optional={"value": json_values | st.sampled_from(["1e999", "nan", "3"])}
        )
        | json_values,
        "startsAt": st.sampled_from(["2026-01-01T00:00:00.123456789Z", "0001-01-01T00:00:00Z"])
        | json_values,
    },
)
payloads = st.fixed_dictionaries(
    {}, optional={"alerts": st.lists(alerts, max_size=3) | json_values}
)


HUGE_VALUE = json.dumps(
    {"alerts": [{"labels": {"kind": "x"}, "annotations": {"value": 10**400}}]}
).encode()


@FUZZ
@given(st.binary(max_size=300) | json_values.map(_json_bytes) | payloads.map(_json_bytes))
@example(b"[" * 100_000)
@example(HUGE_VALUE)
def test_webhook_decoder_raises_only_value_error(body: bytes) -> None:
    try:
        findings = decode_alerts(body)
    except ValueError:
        return
    for finding in findings:  # what passes can be stored and remediated
        assert isinstance(finding.kind, str)
        assert finding.kind
        assert all(math.isfinite(v) for v in finding.evidence.values())


def test_the_live_webhook_answers_every_fuzzed_request() -> None:
    """Authorised requests of fuzzed bodies are answered 200 or 400; nothing else comes
    back, and the server goes on (a stranger without the token is the chaos suite's)."""
    taken: list[object] = []
    hook = AlertWebhook(lambda finding: taken.append(finding) or [], "t0ken").start()
    port = int(hook.url.split(":")[2].split("/")[0])

    @FUZZ
    @given(st.binary(max_size=300) | json_values.map(_json_bytes) | payloads.map(_json_bytes))
    @example(b"[" * 100_000)  # a RecursionError in json
    @example(HUGE_VALUE)  # an OverflowError in float()
    def post(body: bytes) -> None:
        head = (
            f"POST /alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(head + body)
            status = s.recv(64).split(b" ")[1]
        assert status in (b"200", b"400"), status

    try:
        post()
    finally:
        hook.stop()


dumps = st.fixed_dictionaries(
    {"version": json_values},
    optional={
        "entries": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    k: json_values
                    for k in (
                        "pg_id",
                        "collective_seq_id",
                        "profiling_name",
                        "state",
                        "process_group",
                        "timeout_ms",
                        "duration_ms",
                        "retired",
                    )
                },
            )
            | json_values,
            max_size=5,
        ),
        "pg_config": st.dictionaries(st.text(max_size=4), json_values, max_size=3),
        "pg_status": st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    },
)


@FUZZ
@given(
    st.binary(max_size=300)
    | dumps.map(_json_bytes)
    | dumps.map(pickle.dumps)
    | st.binary(max_size=300).map(lambda b: b"\x80" + b)
)
def test_flight_recorder_parser_raises_only_parse_error(data: bytes) -> None:
    try:
        load_flight_record(data)
    except ParseError:
        pass


@FUZZ
@given(st.text(max_size=200))
def test_policy_and_fault_parsers_raise_only_their_errors(text: str) -> None:
    try:
        parse_policy(text)
    except PolicyError:
        pass
    try:
        parse_specs([text])
    except FaultSpecError:
        pass
