"""Queries against a real Prometheus server scraping a real exporter, both on loopback."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector._http import HTTPSourceError
from collector.prometheus_api import (
    PrometheusClient,
    PrometheusQueryError,
    PrometheusQuerySource,
    _samples,
)
from ft_runtime.ports import free_port

pytestmark = pytest.mark.integration


@pytest.mark.timeout(90)
def test_instant_query_gives_one_sample_per_series(prometheus: str) -> None:
    samples = PrometheusClient(prometheus).query("ee_test_gpu_temp")
    by_gpu = {s.labels["gpu"]: s.value for s in samples}
    assert by_gpu == {"0": 41.0, "1": 77.0}
    assert {s.name for s in samples} == {"ee_test_gpu_temp"}
    assert all(s.labels["job"] == "test" for s in samples)
    assert all(abs(s.time - time.time()) < 60 for s in samples)


@pytest.mark.timeout(90)
def test_expression_without_a_name_takes_the_given_name(prometheus: str) -> None:
    samples = PrometheusClient(prometheus).query("max(ee_test_gpu_temp)", name="hottest")
    assert [(s.name, s.value) for s in samples] == [("hottest", 77.0)]
    scalar = PrometheusClient(prometheus).query("scalar(max(ee_test_gpu_temp)) * 2")
    assert [s.value for s in scalar] == [154.0]


@pytest.mark.timeout(90)
def test_range_query_gives_points_over_time(prometheus: str) -> None:
    time.sleep(2)  # let a few scrapes land
    now = time.time()
    samples = PrometheusClient(prometheus).query_range(
        'ee_test_gpu_temp{gpu="1"}', start=now - 30, end=now, step=1
    )
    assert len(samples) >= 2
    assert {s.value for s in samples} == {77.0}
    times = [s.time for s in samples]
    assert times == sorted(times)


@pytest.mark.timeout(90)
def test_bad_promql_names_the_problem(prometheus: str) -> None:
    with pytest.raises(PrometheusQueryError, match="bad_data.*parse error"):
        PrometheusClient(prometheus).query("sum(ee_test_gpu_temp")


@pytest.mark.timeout(90)
def test_bad_ranges_are_refused_before_asking(prometheus: str) -> None:
    client = PrometheusClient(prometheus)
    with pytest.raises(PrometheusQueryError, match="step"):
        client.query_range("up", start=0, end=10, step=0)
    with pytest.raises(PrometheusQueryError, match="before start"):
        client.query_range("up", start=10, end=0, step=1)
    with pytest.raises(PrometheusQueryError, match="larger step"):
        client.query_range("up", start=0, end=1e6, step=1)


@pytest.mark.timeout(90)
def test_source_keeps_answering_when_one_query_fails(prometheus: str) -> None:
    source = PrometheusQuerySource(
        PrometheusClient(prometheus), {"temp": "max(ee_test_gpu_temp)", "broken": "sum("}
    )
    assert [(s.name, s.value) for s in source.collect()] == [("temp", 77.0)]
    assert source.dropped == {"broken": 1}


def test_unreachable_server_gives_a_clear_error() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(HTTPSourceError, match="cannot reach.*running"):
        client.query("up")


def test_a_server_that_is_not_prometheus_is_named(exporter: int) -> None:
    with pytest.raises(PrometheusQueryError, match="Prometheus"):
        PrometheusClient(f"http://127.0.0.1:{exporter}").query("up")


def test_not_a_url_is_refused() -> None:
    with pytest.raises(HTTPSourceError, match="not an http"):
        PrometheusClient("ftp://x").query("up")


_point = st.one_of(
    st.tuples(st.floats(allow_nan=False), st.text(max_size=10)),
    st.lists(st.text(max_size=5), max_size=3),
    st.none(),
    st.integers(),
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["vector", "matrix", "scalar", "string", "bogus", None]),
    st.lists(
        st.fixed_dictionaries(
            {
                "metric": st.dictionaries(st.text(max_size=5), st.text(max_size=5)),
                "value": _point,
                "values": st.lists(_point, max_size=3),
            }
        ),
        max_size=3,
    )
    | _point,
)
def test_any_answer_gives_samples_or_a_query_error(kind: str | None, result: object) -> None:
    try:
        _samples({"resultType": kind, "result": result}, "q")
    except PrometheusQueryError:
        pass
