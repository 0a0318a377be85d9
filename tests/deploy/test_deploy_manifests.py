"""Every manifest under deploy/ against the Kubernetes OpenAPI schemas (kubernetes-validate, offline, strict:
unknown fields are errors), plus the cross-references a schema cannot see: kustomization lists, Service
selectors and ports, images, ServiceMonitor shape."""

import subprocess

import kubernetes_validate
import pytest
import yaml
from capabilities import tool
from deploy_helpers import DEPLOY, DRA, NAMESPACE, assert_valid_kubernetes, find, load_manifests, manifest_files

# The oldest Kubernetes we claim (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy is GA in 1.30), and the
# one whose kube-scheduler image the Deployment runs. deploy/dra/ (DRA mode) is not checked here: resource.k8s.io/v1
# exists only from 1.34, so its manifests would fail the 1.30 schemas; test_deploy_dra.py validates them.
K8S_VERSIONS = ("1.30", "1.34")
SCHEDULER_IMAGE_TAG = "v1.34.0"
# Kinds whose schema ships with no Kubernetes release (CRDs); their shape is checked below instead.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}
OUR_IMAGE = "vgpu-sharing/vgpu"

MANIFESTS = load_manifests()


def kustomizations() -> dict:
    """Every kustomization.yaml under deploy/ but deploy/dra/ (see K8S_VERSIONS), by its directory."""
    return {p.parent: yaml.safe_load(p.read_text()) for p in DEPLOY.rglob("kustomization.yaml")
            if not p.is_relative_to(DRA)}


def workloads() -> list[dict]:
    """The Deployments and DaemonSets."""
    return [m.doc for m in MANIFESTS if m.doc["kind"] in ("Deployment", "DaemonSet")]


def test_validator_ships_the_chosen_versions():
    shipped = set(kubernetes_validate.utils.all_versions())
    for version in K8S_VERSIONS:
        assert any(v.startswith(version + ".") for v in shipped), (version, sorted(shipped))


def test_only_known_crds_lack_a_schema():
    crds = {(m.doc["apiVersion"], m.doc["kind"]) for m in MANIFESTS} & CRD_KINDS
    assert crds == CRD_KINDS  # each is shape-checked below
    for m in MANIFESTS:
        if (m.doc["apiVersion"], m.doc["kind"]) in CRD_KINDS:
            with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
                kubernetes_validate.validate(m.doc, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "manifest", [m for m in MANIFESTS if (m.doc["apiVersion"], m.doc["kind"]) not in CRD_KINDS], ids=lambda m: m.id
)
def test_manifest_is_valid_kubernetes(manifest, version, no_network):
    assert_valid_kubernetes(manifest, version)


def test_objects_are_unique_and_namespaced_in_ours():
    seen = set()
    for m in MANIFESTS:
        meta = m.doc["metadata"]
        key = (m.doc["kind"], meta.get("namespace"), meta["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
        if m.doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, m.id
        elif m.doc["kind"] == "RoleBinding" and meta["name"] == "vgpu-kube-scheduler-authentication-reader":
            assert meta["namespace"] == "kube-system", m.id  # the only object outside our namespace
        else:
            assert meta.get("namespace") == NAMESPACE, m.id
        assert meta.get("labels", {}).get("app.kubernetes.io/part-of") == "vgpu-sharing", m.id


def test_every_manifest_is_listed_in_exactly_one_kustomization():
    listed = {}
    for directory, kust in kustomizations().items():
        assert kust["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and kust["kind"] == "Kustomization"
        for entry in kust.get("resources", []):
            path = (directory / entry).resolve()
            assert path.is_file(), f"{directory}/kustomization.yaml lists missing {entry}"
            assert path not in listed, f"{entry} listed twice"
            listed[path] = directory
        for gen in kust.get("configMapGenerator", []):
            for spec in gen.get("files", []):
                assert (directory / spec.split("=", 1)[-1]).is_file(), spec
    assert set(listed) == {p.resolve() for p in manifest_files()}


def test_kustomization_image_tags_match_the_manifests():
    images = {i["name"]: i["newTag"] for i in kustomizations()[DEPLOY]["images"]}
    used = {c["image"] for w in workloads() for c in w["spec"]["template"]["spec"]["containers"]}
    assert used == {f"{OUR_IMAGE}:{images[OUR_IMAGE]}", f"registry.k8s.io/kube-scheduler:{SCHEDULER_IMAGE_TAG}"}
    assert images["registry.k8s.io/kube-scheduler"] == SCHEDULER_IMAGE_TAG


@pytest.mark.parametrize("directory", ["deploy", "deploy/monitoring"])
def test_kustomize_renders_valid_objects(directory):
    kubectl = tool("kubectl", "https://kubernetes.io/docs/tasks/tools/ (kubectl has kustomize built in)")
    command = [kubectl, "kustomize", str(DEPLOY.parent / directory)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert docs
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    if directory == "deploy/monitoring":
        dashboards = [d for d in docs if d["kind"] == "ConfigMap"]
        assert len(dashboards) == 1 and dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert dashboards[0]["metadata"]["namespace"] == NAMESPACE


def test_pod_templates_match_their_selectors_and_use_our_service_accounts():
    service_accounts = {m.doc["metadata"]["name"] for m in MANIFESTS if m.doc["kind"] == "ServiceAccount"}
    for w in workloads():
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items(), w["metadata"]["name"]
        assert w["spec"]["template"]["spec"]["serviceAccountName"] in service_accounts


@pytest.mark.parametrize(
    "service, port, workload_names",
    [
        ("vgpu-device-plugin-metrics", 9394, {"vgpu-device-plugin", "vgpu-device-plugin-sim"}),
        ("vgpu-scheduler-metrics", 9395, {"vgpu-scheduler"}),
    ],
)
def test_metrics_services_select_the_right_pods_and_ports(service, port, workload_names):
    svc = find("Service", service)
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["port"] == port and svc_port["name"] == "metrics"
    selected = set()
    for w in workloads():
        if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items():
            selected.add(w["metadata"]["name"])
            ports = [p for c in w["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
            named = [p for p in ports if p["name"] == svc_port["targetPort"]]
            assert [p["containerPort"] for p in named] == [port], w["metadata"]["name"]
    assert selected == workload_names


def test_servicemonitor_shape():
    sm = find("ServiceMonitor", "vgpu-sharing")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    spec = sm["spec"]
    assert set(spec) <= {"namespaceSelector", "selector", "endpoints", "jobLabel"}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    selector = spec["selector"]["matchLabels"]
    services = [m.doc for m in MANIFESTS if m.doc["kind"] == "Service"]
    selected = {s["metadata"]["name"] for s in services if selector.items() <= s["metadata"]["labels"].items()}
    assert selected == {"vgpu-device-plugin-metrics", "vgpu-scheduler-metrics"}
    allowed = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings"}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= allowed, endpoint
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
        assert endpoint["honorLabels"] is True  # keeps the workload's namespace/pod/container labels
        for key in ("interval", "scrapeTimeout"):
            assert endpoint[key].endswith("s") and int(endpoint[key][:-1]) > 0


def test_dockerfile_builds_the_library_and_downloads_nothing_else():
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    code = "\n".join(lines)
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert len(stages) >= 2, "multi-stage build expected"
    assert "pip wheel" in code  # setup.py's build step runs make -C isolation
    assert "gcc" in code
    assert "/opt/vgpu/lib/libvgpu.so" in code
    for word in ("curl ", "wget ", "ADD http", "git clone"):
        assert word not in code, f"Dockerfile must not download with {word.strip()!r}"
    assert not any(ln.upper().startswith("ADD ") for ln in lines)
    # The runtime image keeps nothing under /usr/local/vgpu: the DaemonSet mounts a hostPath there.
    assert "/usr/local/vgpu" not in code
