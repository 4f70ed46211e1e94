"""The `eagleeye` rendezvous backend's registration and its keys of `--rdzv-conf`."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from eagleeye.errors import EagleEyeError
from eagleeye.torchrun import BackendOptions, create_handler


def test_torch_finds_the_backend_through_the_entry_point() -> None:
    found = {ep.name: ep for ep in entry_points(group="torchrun.handlers")}
    assert "eagleeye" in found, "reinstall the package (pip install -e .) to register it"
    assert found["eagleeye"].load()() is create_handler
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    assert rendezvous_handler_registry._registry.get("eagleeye") is create_handler


def test_the_defaults_are_a_dry_run_on_loopback() -> None:
    options = BackendOptions.from_conf({"join_timeout": "60"})  # torch's keys pass by
    assert options == BackendOptions("runs", False, "127.0.0.1")


@pytest.mark.parametrize(("text", "acts"), [("1", True), ("true", True), ("0", False)])
def test_remediate_is_asked_for_explicitly(text: str, acts: bool) -> None:
    conf = {"eagleeye_remediate": text, "eagleeye_runs_dir": "/data/runs"}
    options = BackendOptions.from_conf(conf)
    assert options.remediate is acts
    assert options.runs_dir == "/data/runs"


@pytest.mark.parametrize(
    ("conf", "named"),
    [
        ({"eagleeye_remediat": "1"}, "unknown --rdzv-conf keys ['eagleeye_remediat']"),
        ({"eagleeye_remediate": "sure"}, "eagleeye_remediate='sure': give 1 (act) or 0"),
    ],
)
def test_a_bad_key_or_value_is_named(conf: dict[str, str], named: str) -> None:
    with pytest.raises(EagleEyeError) as raised:
        BackendOptions.from_conf(conf)
    assert named in str(raised.value)
