"""deploy/kubernetes/: the kustomize base, rendered as ``kubectl apply -k``
renders it (``kubectl kustomize``), is valid against the Kubernetes API's
schemas, runs the Procfile's commands with real settings, and reads every
secret from the Secret (docs/deploy.md, "On Kubernetes").

kubectl comes from Debian's ``kubernetes-client`` package; scripts/test
installs it (scripts/lib.sh, ``ensure_kubectl``). No cluster is needed or
reached. A missing kubectl fails these tests: nothing here is skipped. The
schemas are kubernetes-validate's own copies (a dev extra): no download.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography.fernet import Fernet
from kubernetes_validate.utils import all_versions

from ingest.app import create_app
from models.settings import Settings, unknown_variables
from tests.support.procfile import expanded, procfile

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

#: The settings that carry passwords or keys: only ever from the Secret.
SECRET_SETTINGS = {
    "TASKHOOK_DATABASE_URL",
    "TASKHOOK_BROKER_URL",
    "TASKHOOK_ENCRYPTION_KEYS",
    "TASKHOOK_RESULT_BACKEND_URL",
    "TASKHOOK_METRICS_TOKEN",
}
#: The Secret's keys a process cannot run without (the others are optional).
REQUIRED_SECRETS = {"TASKHOOK_DATABASE_URL", "TASKHOOK_BROKER_URL", "TASKHOOK_ENCRYPTION_KEYS"}
#: The processes that run deliveries (or an operator's task) and must finish them.
CELERY_WORKERS = ("worker", "live", "operator")
COMPONENT = "app.kubernetes.io/component"
#: Kubernetes' ``$(VAR)`` in a command (``$$`` is a literal ``$``).
KUBERNETES_REFERENCE = re.compile(r"\$\$|\$\((\w+)\)")


def kubectl() -> str:
    found = shutil.which(os.environ.get("KUBECTL", "kubectl"))
    if found is None:
        pytest.fail(
            "kubectl is not installed: scripts/test installs it (Debian's kubernetes-client "
            "package: apt-get install --no-install-recommends kubernetes-client), or set "
            "KUBECTL to its path"
        )
    return found


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    ran = subprocess.run(
        [kubectl(), "kustomize", str(BASE)], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    return [document for document in yaml.safe_load_all(ran.stdout) if document]


def by_component(rendered: list[dict], kind: str) -> dict[str, dict]:
    found = [doc for doc in rendered if doc["kind"] == kind]
    named = {doc["metadata"]["labels"][COMPONENT]: doc for doc in found}
    assert len(named) == len(found), f"two {kind}s of one component"
    return named


def workloads(rendered: list[dict]) -> dict[str, dict]:
    """Each Deployment's and the Job's pod spec, by component."""
    return {
        component: doc["spec"]["template"]["spec"]
        for kind in ("Deployment", "Job")
        for component, doc in by_component(rendered, kind).items()
    }


def settings_map(rendered: list[dict]) -> dict[str, str]:
    (config,) = by_component(rendered, "ConfigMap").values()
    return config["data"]


def environment(container: dict, rendered: list[dict]) -> dict[str, str]:
    """What the container's process sees: the ConfigMap, then its own values
    (a secret reference stands as ``<secret KEY>``)."""
    env = dict(settings_map(rendered))
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        env[entry["name"]] = f"<secret {ref['key']}>" if ref else entry["value"]
    return env


def kubernetes_expanded(command: list[str], env: dict[str, str]) -> list[str]:
    """``command`` as Kubernetes runs it: ``$(VAR)`` from the container's
    environment (left as it is when VAR is not there), ``$$`` as ``$``."""

    def replace(match: re.Match) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return [KUBERNETES_REFERENCE.sub(replace, word) for word in command]


def only_container(pod: dict) -> dict:
    (container,) = pod["containers"]
    return container


def test_the_base_lists_every_manifest_in_its_folder():
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    on_disk = sorted(path.name for path in BASE.glob("*.yaml") if path.name != "kustomization.yaml")
    assert sorted(listed) == on_disk


def test_every_manifest_is_valid_against_the_kubernetes_schemas(rendered):
    """Strict: a field the API does not have (a misspelling) is refused too.
    On the oldest and the newest Kubernetes whose schemas kubernetes-validate has."""
    versions = sorted({all_versions()[0], all_versions()[-1]})
    problems = []
    for document in rendered:
        for version in versions:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                name = f"{document['kind']}/{document['metadata']['name']}"
                problems.append(f"{name} on {version}: {error.message}")
    assert problems == []
    assert {doc["kind"] for doc in rendered} == {
        "ConfigMap",
        "Deployment",
        "Job",
        "PodDisruptionBudget",
        "Service",
    }


def test_the_check_refuses_a_misspelled_field(rendered):
    deployment = next(doc for doc in rendered if doc["kind"] == "Deployment")
    misspelled = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(misspelled, all_versions()[-1], strict=True)


def test_a_deployment_per_procfile_process_runs_its_command(rendered):
    """With the container's environment, Kubernetes' command is the Procfile's
    line as its shell expands it; the release step is the Job's."""
    processes = procfile()
    deployments = by_component(rendered, "Deployment")
    assert sorted(deployments) == sorted(set(processes) - {"release"})
    (job,) = by_component(rendered, "Job")
    assert job == "release"
    for name, pod in workloads(rendered).items():
        container = only_container(pod)
        env = environment(container, rendered)
        assert "args" not in container, name
        assert kubernetes_expanded(container["command"], env) == expanded(processes[name], env)


def test_beat_is_one_pod_whose_schedule_is_on_its_volume(rendered):
    beat = by_component(rendered, "Deployment")["beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    container = only_container(beat["spec"]["template"]["spec"])
    schedule = environment(container, rendered)["TASKHOOK_BEAT_SCHEDULE"]
    mounts = [mount["mountPath"] for mount in container["volumeMounts"]]
    assert any(schedule.startswith(mount.rstrip("/") + "/") for mount in mounts), schedule


def test_every_variable_is_a_setting_and_the_settings_hold_together(rendered, monkeypatch):
    """Every name is a TASKHOOK_ variable taskhook reads (no misspelling that
    would be ignored), and the values, with secrets of the right shape, are
    ones the settings accept."""
    for name, pod in workloads(rendered).items():
        env = environment(only_container(pod), rendered)
        assert all(key.startswith("TASKHOOK_") for key in env), (name, sorted(env))
        assert unknown_variables(env) == [], name
        for key in list(os.environ):
            if key.startswith("TASKHOOK_"):
                monkeypatch.delenv(key)
        for key, value in env.items():
            if key not in SECRET_SETTINGS:
                monkeypatch.setenv(key, value)
        monkeypatch.setenv("TASKHOOK_DATABASE_URL", "postgresql+psycopg://taskhook:pw@db/taskhook")
        monkeypatch.setenv("TASKHOOK_BROKER_URL", "amqp://taskhook:pw@rabbitmq/taskhook")
        monkeypatch.setenv("TASKHOOK_ENCRYPTION_KEYS", Fernet.generate_key().decode())
        Settings()  # raises on a value the settings refuse


def test_secrets_come_from_the_secret_and_never_from_the_manifests(rendered):
    assert not [doc for doc in rendered if doc["kind"] == "Secret"]
    assert not SECRET_SETTINGS & set(settings_map(rendered))
    for name, pod in workloads(rendered).items():
        container = only_container(pod)
        assert container["envFrom"] == [{"configMapRef": {"name": "taskhook"}}], name
        secret = {}
        for entry in container["env"]:
            if entry["name"] in SECRET_SETTINGS:
                assert "value" not in entry, (name, entry["name"])
                secret[entry["name"]] = entry["valueFrom"]["secretKeyRef"]
        # Every process gets the same secrets, each under its own name.
        assert sorted(secret) == sorted(SECRET_SETTINGS), name
        for key, ref in secret.items():
            assert ref["name"] == "taskhook" and ref["key"] == key, (name, key)
            assert ref.get("optional", False) == (key not in REQUIRED_SECRETS), (name, key)


def test_the_docs_create_the_secret_the_manifests_read():
    page = DEPLOY_DOC.read_text()
    created = set(re.findall(r"--from-literal=(TASKHOOK_\w+)=", page))
    assert REQUIRED_SECRETS <= created <= SECRET_SETTINGS


def test_the_ingress_is_probed_on_routes_it_has_and_on_its_port(rendered):
    web = only_container(workloads(rendered)["web"])
    (port,) = web["ports"]
    assert port["containerPort"] == int(settings_map(rendered)["TASKHOOK_PORT"])
    assert web["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert web["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    app = create_app(Settings(), publish=lambda *_: None)
    routes = {getattr(route, "path", None) for route in app.routes}
    assert {"/healthz", "/readyz"} <= routes
    (service,) = (doc for doc in rendered if doc["kind"] == "Service")
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    pods = by_component(rendered, "Deployment")["web"]["spec"]["template"]["metadata"]
    assert service["spec"]["selector"].items() <= pods["labels"].items()


def test_workers_outlast_a_task_and_keep_running_through_a_drain(rendered):
    limit = int(settings_map(rendered)["TASKHOOK_TASK_TIME_LIMIT_SECONDS"])
    assert int(settings_map(rendered)["TASKHOOK_LEASE_SECONDS"]) > limit
    for name in CELERY_WORKERS:
        assert workloads(rendered)[name]["terminationGracePeriodSeconds"] > limit, name
    budgets = by_component(rendered, "PodDisruptionBudget")
    assert {"worker", "live"} <= set(budgets)
    deployments = by_component(rendered, "Deployment")
    for name, budget in budgets.items():
        selector = budget["spec"]["selector"]["matchLabels"].items()
        selected = [
            component
            for component, deployment in deployments.items()
            if selector <= deployment["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected == [name]
        assert budget["spec"]["maxUnavailable"] == 1


def test_every_pod_requests_what_it_needs_and_gets_no_service_links(rendered):
    for name, pod in workloads(rendered).items():
        resources = only_container(pod)["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), name
        assert "memory" in resources["limits"], name
        # Service links would set <SERVICE>_PORT and the like (for taskhook-web,
        # under our prefix): unknown settings.
        assert pod["enableServiceLinks"] is False, name


def test_the_docs_apply_order_applies_the_job_alone_before_the_rest(rendered):
    """The docs' ``kubectl apply -k ... -l`` commands, selected as kubectl does:
    the ConfigMap, then the Job alone, then everything."""
    commands = [
        line.split("  #")[0].strip()
        for line in DEPLOY_DOC.read_text().splitlines()
        if line.startswith("kubectl ") and ("taskhook-release" in line or " -k " in line)
    ]
    assert commands == [
        "kubectl delete job taskhook-release --ignore-not-found",
        f"kubectl apply -k deploy/kubernetes -l {COMPONENT}=settings",
        f"kubectl apply -k deploy/kubernetes -l {COMPONENT}=release",
        "kubectl wait --for=condition=complete --timeout=15m job/taskhook-release",
        "kubectl apply -k deploy/kubernetes",
    ]
    for document in rendered:
        assert document["metadata"]["labels"]["app.kubernetes.io/name"] == "taskhook"

    def selected(command: str) -> list[str]:
        key, _, value = command.partition(" -l ")[2].partition("=")
        return [doc["kind"] for doc in rendered if doc["metadata"]["labels"].get(key) == value]

    assert selected(commands[1]) == ["ConfigMap"]
    assert selected(commands[2]) == ["Job"]
