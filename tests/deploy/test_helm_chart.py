"""The Helm chart, rendered by Helm's own Go SDK (helm-python-sdk) and validated offline: core kinds against the
Kubernetes JSON schemas of kubernetes-validate (strict: unknown fields are errors), the Gateway API and Prometheus
Operator kinds against their CRDs' schemas (@kubernetes-models on npm, run by node). No cluster is involved: what
the schemas cannot say (a GPU node, a gateway, prometheus-adapter) is not tested here."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from wsserver.config import parse_args

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "voxstream"
VALIDATORS = Path(__file__).resolve().parent
KUBERNETES_VERSIONS = ("1.29.0", "1.33.0", "1.37.0")
CUSTOM_GROUPS = ("gateway.networking.k8s.io/", "monitoring.coreos.com/")  # validated by their CRDs' schemas
EVERYTHING = {
    "autoscaling": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "httpRoute": {"enabled": True, "parentRefs": [{"name": "gateway", "namespace": "infra"}], "hostnames": ["tts"]},
    "ingress": {"enabled": True, "host": "tts.example.com", "tlsSecret": "tts-tls"},
    "voices": {"create": {"enabled": True, "storageClassName": "nfs"}},
    "model": {"existingClaim": "checkpoints", "id": "VoxCPM2"},
    "server": {
        "apiKey": {"existingSecret": "voxstream-key"},
        "extraEnv": [{"name": "TTSWS_MAX_PATCHES", "value": "9"}],
    },
}


def render(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """kind -> resource, of the chart rendered with `values`."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name="tts", namespace="speech")
    resources = [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]
    kinds = {resource["kind"]: resource for resource in resources}
    assert len(kinds) == len(resources)
    return kinds


def test_helm_lint_passes_strictly() -> None:
    for values in ({}, EVERYTHING):
        report = helm.lint(CHART, values, strict=True, kube_version="v1.30.0")
        assert not report["errors"]
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_every_resource_is_valid_against_the_kubernetes_schemas(values: dict[str, Any]) -> None:
    resources = render(values)
    custom = [r for r in resources.values() if r["apiVersion"].startswith(CUSTOM_GROUPS)]
    core = [r for r in resources.values() if not r["apiVersion"].startswith(CUSTOM_GROUPS)]
    for resource in core:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(resource, version, strict=True)
    if custom:
        assert validate_custom(custom) == [None] * len(custom)


def validate_custom(resources: list[dict[str, Any]]) -> list[str | None]:
    node = shutil.which("node")
    assert node is not None and (VALIDATORS / "node_modules").is_dir(), "scripts/setup.sh --test installs them"
    result = subprocess.run(
        [node, VALIDATORS / "validate_crds.mjs"], input=json.dumps(resources), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_crd_validators_catch_mistakes() -> None:
    route = render(EVERYTHING)["HTTPRoute"]
    route["spec"]["rules"][0]["timeouts"]["request"] = "forever"
    monitor = render(EVERYTHING)["ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["port"] = 8000
    assert all(validate_custom([route, monitor]))
    with pytest.raises(kubernetes_validate.ValidationError):
        deployment = render()["Deployment"]
        deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
        kubernetes_validate.validate(deployment, "1.33.0", strict=True)


def test_one_gpu_per_pod_probes_and_a_grace_period_longer_than_the_drain() -> None:
    pod = render()["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    env = {e["name"]: e.get("value") for e in container["env"]}
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + float(env["TTSWS_DRAIN_TIMEOUT_S"])
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]


def test_the_environment_is_the_servers_own_flags() -> None:
    [container] = render(EVERYTHING)["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert all(name.startswith("TTSWS_") for name in env)
    config = parse_args([], env=env)  # every variable is read by the server, with the value the chart meant
    assert (config.model, config.devices, config.bind_host, config.port) == ("/models/VoxCPM2", "cuda", "0.0.0.0", 8000)
    assert (config.max_connections, config.max_num_seqs, config.drain_timeout_s) == (256, 64, 30.0)
    assert (str(config.voices_store), config.max_patches) == ("/data/voices", 9)
    assert {"name": "TTSWS_API_KEY", "valueFrom": {"secretKeyRef": {"name": "voxstream-key", "key": "api-key"}}} in (
        container["env"]
    )


def test_the_resources_point_at_each_other() -> None:
    resources = render(EVERYTHING)
    deployment, service = resources["Deployment"], resources["Service"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"],
        resources["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        resources["ServiceMonitor"]["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items()
    assert (
        service["metadata"]["labels"].items() >= resources["ServiceMonitor"]["spec"]["selector"]["matchLabels"].items()
    )
    assert resources["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    [backend] = resources["HTTPRoute"]["spec"]["rules"][0]["backendRefs"]
    assert (backend["name"], backend["port"]) == (service["metadata"]["name"], service["spec"]["ports"][0]["port"])
    ingress_backend = resources["Ingress"]["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert ingress_backend["name"] == service["metadata"]["name"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert (
        volumes["voices"]["persistentVolumeClaim"]["claimName"]
        == resources["PersistentVolumeClaim"]["metadata"]["name"]
    )
    assert "replicas" not in deployment["spec"]  # the HPA owns it


@pytest.mark.parametrize(
    "values",
    [
        {"autoscaling": {"enabeld": True}},  # a typo is refused, not ignored
        {"httpRoute": {"enabled": True}},  # a route without a gateway to attach to
        {"httpRoute": {"requestTimeout": "never"}},
        {"server": {"maxNumSeqs": 0}},
    ],
)
def test_the_values_schema_refuses_mistakes(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError):
        render(values)
