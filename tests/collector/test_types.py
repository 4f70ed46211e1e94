from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from collector.types import Frame, Sample, Subject

names = st.text(min_size=1, max_size=20)
label_maps = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=5)


@given(
    names,
    st.floats(allow_nan=False),
    st.floats(allow_nan=False, allow_infinity=False),
    label_maps,
    st.none() | st.integers(min_value=0, max_value=10**9),
)
def test_sample_survives_a_json_round_trip(name, value, time, labels, step) -> None:
    sample = Sample(name, value, time, labels, step)
    assert Sample.from_json(json.loads(json.dumps(sample.to_json()))) == sample


def test_non_finite_values_round_trip_through_strict_json() -> None:
    frame = Frame(
        Subject(replica=1, rank=3, node="node1"), 7, 1.0, {"loss": math.nan, "grad_norm": math.inf}
    )
    text = json.dumps(frame.to_json(), allow_nan=False)  # strict JSON has no NaN literal
    back = Frame.from_json(json.loads(text))
    assert math.isnan(back.values["loss"])
    assert back.values["grad_norm"] == math.inf
    assert back.subject == frame.subject


def test_records_are_frozen_including_their_mappings() -> None:
    sample = Sample("loss", 1.0, 0.0, {"rank": "0"})
    try:
        sample.labels["rank"] = "1"  # type: ignore[index]
    except TypeError:
        pass
    else:
        raise AssertionError("labels of a frozen Sample were mutable")


def test_subject_scope_names_the_most_specific_field() -> None:
    assert Subject().scope == "job"
    assert Subject(replica=1).scope == "replica"
    assert Subject(replica=1, node="n").scope == "node"
    assert Subject(replica=1, rank=2, node="n").scope == "rank"
    assert str(Subject(rank=2)) == "rank 2"
