"""The shipped Kubernetes manifests validate offline against the API schema (strict: an
unknown field is an error), and the agents' pods take their node rank from the indexed
Job's completion index and reach the controller's Service."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

validate = pytest.importorskip("kubernetes_validate", reason="the dev extra's validator")

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "eagleeye-job.yaml"
KUBERNETES = "1.30.0"


def documents() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def test_every_manifest_is_valid_against_the_api_schema() -> None:
    docs = documents()
    assert [d["kind"] for d in docs] == ["Service", "Service", "Job", "Job"]
    for doc in docs:
        validate.validate(doc, KUBERNETES, strict=True)  # raises on any error


def test_a_broken_manifest_is_refused() -> None:
    job = documents()[3]
    job["spec"]["completionMode"] = 7  # not a string
    with pytest.raises(validate.ValidationError):
        validate.validate(job, KUBERNETES, strict=True)


def test_the_agents_are_an_indexed_job_one_pod_per_node_rank() -> None:
    services, jobs = documents()[:2], documents()[2:]
    headless = next(s for s in services if s["spec"].get("clusterIP") == "None")
    workers = next(j for j in jobs if j["spec"].get("completionMode") == "Indexed")
    controller = next(j for j in jobs if j is not workers)
    pod = workers["spec"]["template"]["spec"]
    assert pod["subdomain"] == headless["metadata"]["name"]
    assert workers["spec"]["completions"] == workers["spec"]["parallelism"]
    command = " ".join(pod["containers"][0]["args"])
    assert '--node-rank "$JOB_COMPLETION_INDEX"' in command
    assert "--controller eagleeye-controller:29400" in command
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--nnodes={workers['spec']['completions']}" in args
