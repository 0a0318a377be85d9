"""charts/vgpu-sharing, rendered and linted by Helm's own engine (helm-python-sdk: Helm v4 as a library, offline).

One source for both install paths: the chart's default render makes every object `kubectl kustomize deploy/` makes,
with the same spec (Helm's own labels aside); DRA mode equals the overlay deploy/README.md describes, the monitoring
values equal deploy/monitoring, the cert-manager webhook equals deploy/webhook. The objects only one side makes are
listed below. Every documented toggle renders objects valid for the Kubernetes 1.34 schemas (kubernetes-validate,
strict; cert-manager's and the Prometheus Operator's kinds by hand), the webhook's configuration is checked field by
field, and the certificates the chart generates are checked with `cryptography` and a real TLS handshake.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import os
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from capabilities import tool
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID
from deploy_helpers import DEPLOY, NAMESPACE, ROOT, WEBHOOK, Manifest, assert_valid_kubernetes

from vgpu.resources import HAMI_NAMES, QUOTA_CORES, QUOTA_MEMORY

CHART = ROOT / "charts" / "vgpu-sharing"
RELEASE = "vgpu-sharing"
K8S_VERSION = "1.34"
# The cluster version the renders below assume (deploy/'s kube-scheduler image is of this version).
KUBE_VERSION = "v1.34.0"
# Labels Helm's charts add and kustomize's objects do not carry.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}
# `kubectl kustomize deploy/` objects the chart does not make: the Namespace is created before the chart, with the
# grant key (docs/install.md, section 3), since a chart cannot own the namespace its release is stored in.
KUSTOMIZE_ONLY = {("Namespace", NAMESPACE)}
# Objects the chart's default render makes and deploy/ does not: the webhook (deploy/webhook/ is an add-on, since
# it needs cert-manager there) and the certificate the chart generates for it.
CHART_ONLY = {
    ("ServiceAccount", "vgpu-webhook"),
    ("Deployment", "vgpu-webhook"),
    ("Service", "vgpu-webhook"),
    ("PodDisruptionBudget", "vgpu-webhook"),
    ("MutatingWebhookConfiguration", "vgpu-webhook"),
    ("Secret", "vgpu-webhook-tls"),
}
# deploy/ ships the simulated device plugin; the chart makes it only with devicePlugin.simulated.enabled.
SIMULATED = {"devicePlugin": {"simulated": {"enabled": True}}}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "MutatingWebhookConfiguration", "DeviceClass"}
WEBHOOK_DNS = [f"vgpu-webhook.{NAMESPACE}.svc", f"vgpu-webhook.{NAMESPACE}.svc.cluster.local"]


# ------------------------------------------------------------------------------------------------- rendering

@functools.cache
def chart() -> helm.Chart:
    """The chart, loaded once (Helm's loader: what `helm install ./charts/vgpu-sharing` packages)."""
    return helm.Chart.load(CHART)


def render_chart(values: dict | None, *, name: str = RELEASE, namespace: str = NAMESPACE,
                 kube_version: str = KUBE_VERSION) -> dict[str, str]:
    """Template path -> rendered text, as `helm template --kube-version` renders it: the cluster version reaches
    .Capabilities.KubeVersion (the kube-scheduler image's tag follows it). Chart.render has no such argument, so
    this asks the library's renderer directly, with the options `helm template` passes it."""
    from helm_python import _native

    options = {"name": name, "namespace": namespace, "kube_version": kube_version}
    text = _native.call_string("helm_render", chart()._raw(), json.dumps(values or {}), json.dumps(options))
    rendered: dict[str, str] = json.loads(text)
    return rendered


@functools.cache
def _render(values_json: str) -> tuple[tuple[str, str], ...]:
    rendered = render_chart(json.loads(values_json))
    return tuple(sorted(rendered.items()))


def render_files(values: dict | None = None) -> dict[str, str]:
    """Template path -> rendered text, with the release in NAMESPACE (cached per values)."""
    return dict(_render(json.dumps(values or {}, sort_keys=True)))


def render(values: dict | None = None) -> list[dict]:
    """The objects the chart makes with `values` (the YAML documents of every rendered template but NOTES.txt)."""
    out = []
    for path, text in render_files(values).items():
        if path.endswith(".yaml"):
            out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


def by_key(docs: list[dict]) -> dict[tuple[str, str], dict]:
    """(kind, name) -> object; a duplicate is an error."""
    out: dict[tuple[str, str], dict] = {}
    for doc in docs:
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in out, f"{key} made twice"
        out[key] = doc
    return out


def one(docs: list[dict], kind: str, name: str) -> dict:
    """The one object of that kind and name."""
    return by_key(docs)[(kind, name)]


def kustomize(directory: Path) -> list[dict]:
    """The objects `kubectl kustomize` renders from a directory."""
    kubectl = tool("kubectl", "https://kubernetes.io/docs/tasks/tools/ (kubectl has kustomize built in)")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def normalized(doc: dict) -> dict:
    """An object as compared between the two install paths: without Helm's labels, and with the configuration
    files a ConfigMap carries parsed (the chart writes the same YAML from values, in another key order)."""
    doc = json.loads(json.dumps(doc))
    labels = doc["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    if doc["kind"] == "ConfigMap":
        for key, value in doc.get("data", {}).items():
            if key.endswith(".yaml"):
                doc["data"][key] = yaml.safe_load(value)
    return doc


def assert_same_objects(expected: dict[tuple[str, str], dict], got: dict[tuple[str, str], dict]) -> None:
    """The same (kind, name) keys, and each object equal after normalized()."""
    assert sorted(got) == sorted(expected), (
        f"only kustomize: {sorted(set(expected) - set(got))}; only the chart: {sorted(set(got) - set(expected))}")
    for key, doc in expected.items():
        assert normalized(got[key]) == normalized(doc), f"{key} differs"


# ------------------------------------------------------------------------------ what kubernetes-validate lacks

def check_custom_resource(doc: dict) -> None:
    """The shape of the CRD kinds the chart makes, which no Kubernetes release has a schema for: apiVersion, kind,
    required fields, and no field beyond those we use."""
    meta = doc["metadata"]
    assert meta["name"] and meta["namespace"] == NAMESPACE, meta
    assert meta["labels"]["app.kubernetes.io/part-of"] == "vgpu-sharing", meta
    key = (doc["apiVersion"], doc["kind"])
    spec = doc["spec"]
    if key == ("monitoring.coreos.com/v1", "ServiceMonitor"):
        assert set(spec) <= {"namespaceSelector", "selector", "endpoints", "jobLabel"}, spec
        assert spec["selector"]["matchLabels"] and spec["endpoints"]
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels"}, endpoint
            assert endpoint["port"] == "metrics"
    elif key == ("cert-manager.io/v1", "Issuer"):
        assert spec == {"selfSigned": {}}, spec
    elif key == ("cert-manager.io/v1", "Certificate"):
        assert set(spec) <= {"secretName", "commonName", "dnsNames", "issuerRef", "duration", "renewBefore"}, spec
        assert spec["secretName"] and spec["dnsNames"] and all(isinstance(n, str) for n in spec["dnsNames"])
        assert spec["issuerRef"]["name"] and set(spec["issuerRef"]) <= {"name", "kind", "group"}
    else:
        pytest.fail(f"{key}: neither a Kubernetes kind with a schema nor one checked here")


CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("cert-manager.io/v1", "Issuer"),
                ("cert-manager.io/v1", "Certificate")}


# Objects already validated (most are the same in every toggle's render, and a schema check takes some 40 ms).
_VALID: set[str] = set()


def assert_valid(docs: list[dict], label: str) -> None:
    """Every object valid: Kubernetes kinds against the 1.34 schemas (strict), the others by hand; namespaced ones in
    the release namespace (the authentication reader's RoleBinding in kube-system)."""
    for i, doc in enumerate(docs):
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            check_custom_resource(doc)
            continue
        text = json.dumps(doc, sort_keys=True)
        if text not in _VALID:
            assert_valid_kubernetes(Manifest(Path(label), i, doc), K8S_VERSION)
            _VALID.add(text)
        meta = doc["metadata"]
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, (label, doc["kind"], meta["name"])
        elif meta["name"] != "vgpu-kube-scheduler-authentication-reader":
            assert meta["namespace"] == NAMESPACE, (label, doc["kind"], meta["name"])


# ------------------------------------------------------------------------------------------------ Helm's lint

def test_helm_lint_passes_strict():
    for values in (None, {"dra": {"enabled": True}, "webhook": {"certManager": {"enabled": True}},
                          "monitoring": {"serviceMonitor": {"enabled": True}, "dashboard": {"enabled": True}},
                          "consolidation": {"enabled": True, "replicas": 2}}):
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.34.0")
        assert report["total_charts_linted"] == 1
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report  # no warnings, no errors


def test_values_schema_refuses_a_mistyped_value():
    chart().validate_schema({"webhook": {"timeoutSeconds": 5}})
    with pytest.raises(helm.HelmValuesError):
        chart().validate_schema({"webhook": {"timeoutSeconds": "5s"}})
    with pytest.raises(helm.HelmValuesError):
        chart().validate_schema({"devicePlugin": {"enable": True}})  # a misspelt key


# ------------------------------------------------------------------------------------------------- toggles

def containers(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["spec"]["template"]["spec"]["containers"]}


def scheduler_config(docs: list[dict]) -> dict:
    return yaml.safe_load(one(docs, "ConfigMap", "vgpu-scheduler-config")["data"]["config.yaml"])


def keys(docs: list[dict]) -> set[tuple[str, str]]:
    return set(by_key(docs))


def _default(docs):
    assert ("DaemonSet", "vgpu-device-plugin") in keys(docs) and ("Deployment", "vgpu-webhook") in keys(docs)
    assert not {k for k in keys(docs) if k[0] in ("DeviceClass", "ServiceMonitor", "Certificate")}
    assert ("DaemonSet", "vgpu-device-plugin-sim") not in keys(docs)
    # no consolidation controller: no object, no configuration file of its own
    assert not {k for k in keys(docs) if "consolidate" in k[1]}, keys(docs)
    assert "consolidate.yaml" not in one(docs, "ConfigMap", "vgpu-sharing-config")["data"]


def _dra_only(docs):
    names = keys(docs)
    assert ("DaemonSet", "vgpu-dra-plugin") in names and ("DeviceClass", "vgpu.gpu.vgpu-sharing.io") in names
    assert not {k for k in names if "device-plugin" in k[1]}, names
    assert "--dra" in containers(one(docs, "Deployment", "vgpu-scheduler"))["extender"]["command"]


def _dra_and_device_plugin(docs):
    names = keys(docs)
    assert {("DaemonSet", "vgpu-dra-plugin"), ("DaemonSet", "vgpu-device-plugin"),
            ("ValidatingAdmissionPolicy", "vgpu-sharing-dra-plugin-own-node"),
            ("ClusterRoleBinding", "vgpu-scheduler-extender-dra")} <= names
    (extender,) = scheduler_config(docs)["extenders"]
    assert "managedResources" not in extender


def _simulated(docs):
    (c,) = containers(one(docs, "DaemonSet", "vgpu-device-plugin-sim")).values()
    assert "--backend=sim" in c["command"]


def _webhook_off(docs):
    assert not {k for k in keys(docs) if "webhook" in k[1]}, keys(docs)


def _cert_manager(docs):
    names = keys(docs)
    assert {("Issuer", "vgpu-webhook-selfsigned"), ("Certificate", "vgpu-webhook")} <= names
    assert ("Secret", "vgpu-webhook-tls") not in names
    mwc = one(docs, "MutatingWebhookConfiguration", "vgpu-webhook")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/vgpu-webhook"
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    certificate = one(docs, "Certificate", "vgpu-webhook")["spec"]
    assert certificate["dnsNames"] == WEBHOOK_DNS and certificate["secretName"] == "vgpu-webhook-tls"


def _cert_manager_issuer(docs):
    assert ("Issuer", "vgpu-webhook-selfsigned") not in keys(docs)
    assert one(docs, "Certificate", "vgpu-webhook")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp"}


# webhook.tls.caBundle is passed through (base64-encoded), never parsed
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"


def _existing_tls(docs):
    names = keys(docs)
    assert ("Secret", "vgpu-webhook-tls") not in names and ("Certificate", "vgpu-webhook") not in names
    mwc = one(docs, "MutatingWebhookConfiguration", "vgpu-webhook")
    assert base64.b64decode(mwc["webhooks"][0]["clientConfig"]["caBundle"]).decode() == CA_PEM
    assert "annotations" not in mwc["metadata"]
    (volume,) = [v for v in one(docs, "Deployment", "vgpu-webhook")["spec"]["template"]["spec"]["volumes"]
                 if v["name"] == "config"]
    assert [s["secret"]["name"] for s in volume["projected"]["sources"] if "secret" in s] == ["my-webhook-cert"]


def _admission_off(docs):
    assert not {k for k in keys(docs) if k[0].startswith("ValidatingAdmissionPolicy")}
    assert ("MutatingWebhookConfiguration", "vgpu-webhook") in keys(docs)


def _dashboard(docs):
    dashboard = one(docs, "ConfigMap", "vgpu-sharing-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["vgpu-sharing.json"] == (DEPLOY / "monitoring" / "grafana-dashboard.json").read_text()


def _service_monitor(docs):
    monitor = one(docs, "ServiceMonitor", "vgpu-sharing")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def _leader_election_off(docs):
    assert scheduler_config(docs)["leaderElection"] == {"leaderElect": False}
    command = containers(one(docs, "Deployment", "vgpu-scheduler"))["extender"]["command"]
    assert not [a for a in command if a.startswith(("--leader-elect", "--lease-namespace", "--follow-lease"))]
    assert not {k for k in keys(docs) if k[1].endswith("-lease")}, keys(docs)


def _replicas_2(docs):
    assert one(docs, "Deployment", "vgpu-scheduler")["spec"]["replicas"] == 2
    assert one(docs, "Deployment", "vgpu-scheduler")["spec"]["strategy"] == {"type": "Recreate"}
    assert one(docs, "Deployment", "vgpu-webhook")["spec"]["replicas"] == 2


def _extender_tls(docs):
    config = scheduler_config(docs)
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://127.0.0.1:8888" and extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {"certFile": "/etc/vgpu-extender-tls/tls.crt",
                                     "keyFile": "/etc/vgpu-extender-tls/tls.key",
                                     "caFile": "/etc/vgpu-extender-tls/ca.crt"}
    pod = containers(one(docs, "Deployment", "vgpu-scheduler"))
    command = pod["extender"]["command"]
    for flag, file in (("tls-cert-file", "tls.crt"), ("tls-key-file", "tls.key"), ("tls-client-ca-file", "ca.crt")):
        assert f"--{flag}=/etc/vgpu-extender-tls/{file}" in command
    for name in ("kube-scheduler", "extender"):
        assert {"name": "extender-tls", "mountPath": "/etc/vgpu-extender-tls", "readOnly": True} in \
            pod[name]["volumeMounts"]
    probe = pod["extender"]["readinessProbe"]["exec"]["command"][2]
    assert "https://127.0.0.1:8888/readyz" in probe and "load_cert_chain" in probe
    compile(probe, "probe", "exec")
    assert ("Secret", "vgpu-scheduler-extender-tls") in keys(docs)


def _public_keys(docs):
    keys_map = one(docs, "ConfigMap", "vgpu-grant-public-keys")
    assert keys_map["data"]["keys.pem"] == PUBLIC_PEM
    for name in ("vgpu-device-plugin",):
        (volume,) = [v for v in one(docs, "DaemonSet", name)["spec"]["template"]["spec"]["volumes"]
                     if v["name"] == "grant-public-keys"]
        assert volume["configMap"]["name"] == "vgpu-grant-public-keys"


def _preemption_and_topology_off(docs):
    command = containers(one(docs, "Deployment", "vgpu-scheduler"))["extender"]["command"]
    assert "--no-preemption" in command and "--no-topology" in command


def _webhook_network_policy(docs):
    policy = one(docs, "NetworkPolicy", "vgpu-webhook")
    webhook = one(docs, "Deployment", "vgpu-webhook")
    labels = webhook["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    port = containers(webhook)["webhook"]["ports"][0]["containerPort"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]


def _consolidation(docs):
    assert {("Deployment", "vgpu-consolidate"), ("ServiceAccount", "vgpu-consolidate"),
            ("ClusterRole", "vgpu-consolidate"), ("ClusterRoleBinding", "vgpu-consolidate"),
            ("Service", "vgpu-consolidate-metrics")} <= keys(docs)
    assert not {k for k in keys(docs) if k[1] == "vgpu-consolidate-lease"}
    deployment = one(docs, "Deployment", "vgpu-consolidate")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-elect" not in containers(deployment)["consolidate"]["command"]


def _consolidation_leader_election(docs):
    assert {("Role", "vgpu-consolidate-lease"), ("RoleBinding", "vgpu-consolidate-lease")} <= keys(docs)
    deployment = one(docs, "Deployment", "vgpu-consolidate")
    assert deployment["spec"]["replicas"] == 3 and "strategy" not in deployment["spec"]
    command = containers(deployment)["consolidate"]["command"]
    assert command[-2:] == ["--leader-elect", f"--lease-namespace={NAMESPACE}"]


def _quotas_never_required(docs):
    role = one(docs, "ClusterRole", "vgpu-scheduler-extender")
    assert not [r for r in role["rules"] if "resourcequotas" in r["resources"]]
    config = yaml.safe_load(one(docs, "ConfigMap", "vgpu-sharing-config")["data"]["scheduler.yaml"])
    assert config["sharing"]["require_quota_totals"] is False


PUBLIC_PEM = Ed25519PrivateKey.generate().public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

TOGGLES: dict[str, tuple[dict, Callable[[list[dict]], None]]] = {
    "default": ({}, _default),
    "dra-only": ({"devicePlugin": {"enabled": False}, "dra": {"enabled": True}}, _dra_only),
    "dra-and-device-plugin": ({"dra": {"enabled": True}}, _dra_and_device_plugin),
    "simulated": (SIMULATED, _simulated),
    "webhook-off": ({"webhook": {"enabled": False}}, _webhook_off),
    "cert-manager": ({"webhook": {"certManager": {"enabled": True}}}, _cert_manager),
    "cert-manager-issuer": ({"webhook": {"certManager": {"enabled": True, "issuerRef": {
        "kind": "ClusterIssuer", "name": "corp"}}}}, _cert_manager_issuer),
    "existing-tls-secret": ({"webhook": {"tls": {"existingSecret": "my-webhook-cert", "caBundle": CA_PEM}}},
                            _existing_tls),
    "admission-policies-off": ({"admissionPolicies": {"enabled": False}}, _admission_off),
    "dashboard": ({"monitoring": {"dashboard": {"enabled": True}}}, _dashboard),
    "service-monitor": ({"monitoring": {"serviceMonitor": {
        "enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}}}}, _service_monitor),
    "leader-election-off": ({"scheduler": {"leaderElection": {"enabled": False}}}, _leader_election_off),
    "replicas-2": ({"scheduler": {"replicas": 2}}, _replicas_2),
    "extender-tls": ({"scheduler": {"extender": {"tls": {"enabled": True}}}}, _extender_tls),
    "grant-public-keys": ({"grantKey": {"publicKeys": PUBLIC_PEM}}, _public_keys),
    "preemption-topology-off": ({"scheduler": {"extender": {"preemption": False, "topology": False}}},
                                _preemption_and_topology_off),
    "webhook-network-policy": ({"webhook": {"networkPolicy": {"enabled": True, "from": [
        {"ipBlock": {"cidr": "10.0.0.10/32"}}]}}}, _webhook_network_policy),
    "quota-totals-never-required": ({"sharing": {"require_quota_totals": False}}, _quotas_never_required),
    "consolidation": ({"consolidation": {"enabled": True}}, _consolidation),
    "consolidation-leader-election": ({"consolidation": {"enabled": True, "replicas": 3}},
                                      _consolidation_leader_election),
}


@pytest.mark.parametrize("toggle", TOGGLES)
def test_toggle_renders_valid_objects(toggle, no_network):
    values, check = TOGGLES[toggle]
    docs = render(values)
    by_key(docs)  # no object twice
    assert_valid(docs, f"chart[{toggle}]")
    check(docs)


def test_toggle_checks_can_fail():
    """Each toggle's check refuses the default render (so each proves its toggle did something), but the default's."""
    default = render()
    for name, (_, check) in TOGGLES.items():
        if name == "default":
            continue
        with pytest.raises((AssertionError, KeyError, ValueError)):
            check(default)


@pytest.mark.parametrize("values, message", [
    ({"devicePlugin": {"enabled": False}, "dra": {"enabled": False}}, "nothing to install"),
    ({"scheduler": {"replicas": 2, "leaderElection": {"enabled": False}}}, "needs scheduler.leaderElection.enabled"),
    ({"webhook": {"tls": {"existingSecret": "mine"}}}, "needs webhook.tls.caBundle"),
    ({"webhook": {"tls": {"existingSecret": "mine", "caBundle": CA_PEM}, "certManager": {"enabled": True}}},
     "are exclusive"),
    ({"grantKey": {"publicKeys": "-----BEGIN PRIVATE KEY-----\nMC4=\n-----END PRIVATE KEY-----\n"}},
     "holds a private key"),
    ({"webhook": {"networkPolicy": {"enabled": True}}}, "needs webhook.networkPolicy.from"),
], ids=["no-node-agent", "replicas-without-leases", "tls-secret-without-ca", "two-certificate-sources",
        "private-key-as-public", "network-policy-without-peers"])
def test_the_chart_refuses_values_that_install_nothing_or_something_broken(values, message):
    with pytest.raises(helm.HelmRenderError) as refused:
        chart().render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(refused.value)


# ------------------------------------------------------------------------------- one source, two install paths

def test_default_render_makes_what_kustomize_makes():
    expected = {k: d for k, d in by_key(kustomize(DEPLOY)).items() if k not in KUSTOMIZE_ONLY}
    assert set(by_key(kustomize(DEPLOY))) - set(expected) == KUSTOMIZE_ONLY
    with_sim = by_key(render(SIMULATED))
    assert set(with_sim) >= CHART_ONLY
    assert_same_objects(expected, {k: d for k, d in with_sim.items() if k not in CHART_ONLY})
    # the true default differs only by the simulated DaemonSet
    default = by_key(render())
    assert set(with_sim) - set(default) == {("DaemonSet", "vgpu-device-plugin-sim")} and set(default) <= set(with_sim)


def test_dra_render_makes_what_the_dra_overlay_makes(tmp_path):
    """deploy/ + deploy/dra + the component dra/scheduler (deploy/README.md, "DRA mode") against dra.enabled."""
    relative = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [relative, f"{relative}/dra"], "components": [f"{relative}/dra/scheduler"]}))
    expected = {k: d for k, d in by_key(kustomize(tmp_path)).items() if k not in KUSTOMIZE_ONLY}
    got = {k: d for k, d in by_key(render({**SIMULATED, "dra": {"enabled": True}})).items() if k not in CHART_ONLY}
    assert_same_objects(expected, got)


def test_monitoring_values_make_what_deploy_monitoring_makes():
    expected = by_key(kustomize(DEPLOY / "monitoring"))
    docs = by_key(render({"monitoring": {"serviceMonitor": {"enabled": True}, "dashboard": {"enabled": True}}}))
    assert_same_objects(expected, {k: docs[k] for k in expected if k in docs})


def test_cert_manager_webhook_is_deploy_webhook():
    expected = by_key(kustomize(WEBHOOK))
    docs = by_key(render({"webhook": {"certManager": {"enabled": True}}}))
    webhook = {k: d for k, d in docs.items()
               if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"}
    assert_same_objects(expected, webhook)


def test_deploy_webhook_is_valid():
    """deploy/webhook, which the base install's checks leave out (deploy_helpers.base_manifest_files), against the
    1.30 and 1.34 schemas; the cert-manager kinds by hand."""
    docs = kustomize(WEBHOOK)
    assert {(d["apiVersion"], d["kind"]) for d in docs} >= {("cert-manager.io/v1", "Issuer"),
                                                             ("cert-manager.io/v1", "Certificate")}
    for i, doc in enumerate(docs):
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            check_custom_resource(doc)
        else:
            for version in ("1.30", K8S_VERSION):
                assert_valid_kubernetes(Manifest(WEBHOOK / "kustomization.yaml", i, doc), version)


def test_the_dashboard_copy_is_deploys_byte_for_byte():
    """Helm packages only files inside the chart, so the chart carries a copy of the dashboard."""
    copy = CHART / "files" / "grafana-dashboard.json"
    assert not copy.is_symlink()
    assert copy.read_bytes() == (DEPLOY / "monitoring" / "grafana-dashboard.json").read_bytes()


# ------------------------------------------------------------------------------------------ the configuration

def test_both_configuration_files_carry_the_one_sharing_block(tmp_path):
    """scheduler.yaml and device-plugin.yaml through the components' own loaders: the same sharing section, the
    values' (here changed from the defaults), and the resource names it lists are the ones the scheduler manages and
    the placement policy checks."""
    from vgpu.deviceplugin.config import load_config as load_plugin_config
    from vgpu.scheduler.config import load_config as load_scheduler_config

    values = {"sharing": {"split_count": 4, "hami_names": "all", "default_cores": 20, "quota_card_mib": 40960},
              "devicePlugin": {"config": {"handshake": True}}}
    data = one(render(values), "ConfigMap", "vgpu-sharing-config")["data"]
    (tmp_path / "scheduler.yaml").write_text(data["scheduler.yaml"])
    (tmp_path / "device-plugin.yaml").write_text(data["device-plugin.yaml"])
    scheduler = load_scheduler_config(str(tmp_path / "scheduler.yaml"), {}).sharing
    plugin = load_plugin_config(str(tmp_path / "device-plugin.yaml"))
    assert scheduler == plugin.sharing
    assert (scheduler.split_count, scheduler.hami_mode(), scheduler.default_cores, scheduler.quota_card_mib) == \
        (4, "all", 20, 40960)
    assert plugin.resource_mode == "mib" and plugin.handshake is True
    totals = [QUOTA_MEMORY, QUOTA_CORES]
    hami_shares = [HAMI_NAMES.memory, HAMI_NAMES.memory_percentage, HAMI_NAMES.cores]
    for mode, names in (("all", [*scheduler.resources.all(), HAMI_NAMES.number, *hami_shares]),
                        ("shared", [*scheduler.resources.all(), *hami_shares]),
                        ("off", [*scheduler.resources.all()])):
        docs = render({**values, "sharing": {**values["sharing"], "hami_names": mode}})
        (extender,) = scheduler_config(docs)["extenders"]
        assert [r["name"] for r in extender["managedResources"]] == names + totals, mode
        placement = one(docs, "ValidatingAdmissionPolicy", "vgpu-sharing-scheduled-placement")
        (variable,) = [v for v in placement["spec"]["variables"] if v["name"] == "resources"]
        assert variable["expression"] == "[" + ", ".join(f"'{n}'" for n in names) + "]", mode


def test_images_and_names_follow_the_values():
    docs = render({"image": {"repository": "registry.example.com/vgpu", "tag": "9.9.9"},
                   "scheduler": {"schedulerName": "gpu-share", "kubeScheduler": {"image": {"tag": "v1.33.2"}}},
                   "admissionPolicies": {"extraSchedulers": ["system:serviceaccount:volcano-system:volcano"]}})
    images = {c["image"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.example.com/vgpu:9.9.9", "registry.k8s.io/kube-scheduler:v1.33.2"}
    assert scheduler_config(docs)["profiles"][0]["schedulerName"] == "gpu-share"
    assert "--scheduler-name=gpu-share" in containers(one(docs, "Deployment", "vgpu-webhook"))["webhook"]["command"]
    assert "--scheduler-names=gpu-share" in containers(one(docs, "Deployment", "vgpu-scheduler"))["extender"]["command"]
    env = containers(one(docs, "DaemonSet", "vgpu-device-plugin"))["device-plugin"]["env"]
    assert {"name": "SCHEDULER_NAMES", "value": "gpu-share"} in env
    policy = one(docs, "ValidatingAdmissionPolicy", "vgpu-sharing-assignment-annotations")
    (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == "schedulers"]
    assert variable["expression"] == (f"['system:serviceaccount:{NAMESPACE}:vgpu-scheduler-extender', "
                                      "'system:serviceaccount:volcano-system:volcano']")


def test_the_release_namespace_reaches_every_reference():
    docs = by_key(chart_in_other_namespace())
    text = json.dumps(list(docs.values()))
    assert NAMESPACE not in text  # no reference left to the namespace deploy/ uses
    assert scheduler_config(list(docs.values()))["leaderElection"]["resourceNamespace"] == "gpu"
    assert "--follow-lease=gpu/vgpu-kube-scheduler" in \
        containers(docs[("Deployment", "vgpu-scheduler")])["extender"]["command"]
    mwc = docs[("MutatingWebhookConfiguration", "vgpu-webhook")]["webhooks"][0]
    assert mwc["clientConfig"]["service"]["namespace"] == "gpu"
    assert "gpu" in mwc["namespaceSelector"]["matchExpressions"][0]["values"]


def chart_in_other_namespace() -> list[dict]:
    rendered = render_chart({}, namespace="gpu")
    return [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


# -------------------------------------------------------------------------------------------------- the webhook

def test_webhook_configuration():
    docs = render({"webhook": {"excludeNamespaces": ["batch"], "timeoutSeconds": 3}})
    mwc = one(docs, "MutatingWebhookConfiguration", "vgpu-webhook")
    (hook,) = mwc["webhooks"]
    assert hook["name"] == "pods.vgpu-sharing.volcano.sh"
    assert hook["clientConfig"]["service"] == {"namespace": NAMESPACE, "name": "vgpu-webhook", "path": "/mutate-pods",
                                               "port": 443}
    assert hook["clientConfig"]["caBundle"]
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["admissionReviewVersions"]) == ("Ignore", "None", ["v1"])
    assert (hook["timeoutSeconds"], hook["reinvocationPolicy"], hook["matchPolicy"]) == (3, "Never", "Equivalent")
    assert hook["namespaceSelector"] == {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
        "values": ["kube-system", "kube-public", "kube-node-lease", NAMESPACE, "batch"]}]}
    assert "objectSelector" not in hook
    assert one(render(), "MutatingWebhookConfiguration", "vgpu-webhook")["webhooks"][0]["timeoutSeconds"] == 5
    service = one(docs, "Service", "vgpu-webhook")["spec"]
    assert service["selector"] == {"app.kubernetes.io/name": "vgpu-webhook"}
    assert service["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]


def test_webhook_deployment():
    deployment = one(render(), "Deployment", "vgpu-webhook")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == "vgpu-webhook"
    assert one(render(), "ServiceAccount", "vgpu-webhook")["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["command"] == [
        "vgpu", "webhook", "--listen=0.0.0.0:9443",
        "--tls-cert-file=/etc/vgpu-sharing/webhook-tls/tls.crt",
        "--tls-private-key-file=/etc/vgpu-sharing/webhook-tls/tls.key",
        "--config=/etc/vgpu-sharing/scheduler.yaml", "--scheduler-name=vgpu-scheduler",
        "--replace-scheduler-names=default-scheduler", "--translate-hami-names"]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": 9443, "scheme": "HTTPS"}
    assert c["ports"] == [{"name": "https", "containerPort": 9443}]
    (config,) = [v for v in pod["volumes"] if v["name"] == "config"]
    paths = [i["path"] for s in config["projected"]["sources"] for src in s.values() for i in src["items"]]
    assert paths == ["scheduler.yaml", "webhook-tls/tls.crt", "webhook-tls/tls.key"]
    other = containers(one(render({"webhook": {"replaceSchedulerNames": ["default-scheduler", "volcano"],
                                               "translateHamiNames": False}}),
                           "Deployment", "vgpu-webhook"))["webhook"]["command"]
    assert other[-2:] == ["--replace-scheduler-names=default-scheduler,volcano", "--no-translate-hami-names"]
    assert ("PodDisruptionBudget", "vgpu-webhook") not in keys(render({"webhook": {"replicas": 1}}))


def vgpu_commands() -> list:
    """Parametrisation: every `vgpu ...` command line the chart writes, over the values that change them."""
    seen, params = set(), []
    for values in ({**SIMULATED, "dra": {"enabled": True}, "scheduler": {"extender": {"tls": {"enabled": True}}},
                    "consolidation": {"enabled": True}},
                   {"webhook": {"translateHamiNames": False, "replaceSchedulerNames": ["a", "b"]},
                    "consolidation": {"enabled": True, "replicas": 2,
                                      "extraArgs": ["--scheduler-names=vgpu-scheduler,volcano"]}}):
        for doc in render(values):
            if doc["kind"] not in ("Deployment", "DaemonSet"):
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["command"][0] != "vgpu" or tuple(c["command"]) in seen:
                    continue
                seen.add(tuple(c["command"]))
                params.append(pytest.param(c["command"], id=f"{doc['metadata']['name']}-{len(params)}"))
    return params


@pytest.mark.parametrize("command", vgpu_commands())
def test_the_image_accepts_every_command_line(command, capsys):
    """Each container's command through the real `vgpu` parser (an unknown flag would crash-loop the pod)."""
    from vgpu.cli import build_parser

    try:
        build_parser().parse_args(command[1:])
    except SystemExit:
        pytest.fail(f"vgpu refuses {command}: {capsys.readouterr().err.strip()}")


# ------------------------------------------------------------------------------ the consolidation controller

CONSOLIDATION = {"enabled": True, "interval": "1m", "pendingFor": "10m", "moveShare": 0.1, "minAge": "2h",
                 "maxMoves": 4,
                 "timeout": 300, "hold": "15m", "logLevel": "DEBUG", "metricsPort": 9500,
                 "extraArgs": ["--scheduler-names=vgpu-scheduler,volcano"], "nodeSelector": {"role": "control"},
                 "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                 "resources": {"requests": {"cpu": "10m"}}}


def test_the_consolidation_controller_runs_with_the_values():
    docs = render({"consolidation": CONSOLIDATION})
    deployment = one(docs, "Deployment", "vgpu-consolidate")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert pod["serviceAccountName"] == "vgpu-consolidate" and "automountServiceAccountToken" not in pod
    assert pod["nodeSelector"] == {"role": "control"} and pod["tolerations"] == CONSOLIDATION["tolerations"]
    assert "affinity" not in pod and pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["image"] == "vgpu-sharing/vgpu:0.1.0"
    assert c["command"] == [
        "vgpu", "consolidate", "--watch", "--config=/etc/vgpu-sharing/consolidate.yaml", "--interval=1m",
        "--pending-for=10m", "--move-share=0.1", "--min-age=2h", "--max-moves=4", "--timeout=300", "--hold=15m",
        "--metrics-listen=:9500", "--log-level=DEBUG", "--scheduler-names=vgpu-scheduler,volcano"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500}]
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}  # merged
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert {"name": "config", "mountPath": "/etc/vgpu-sharing", "readOnly": True} in c["volumeMounts"]
    (config,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert config["configMap"] == {"name": "vgpu-sharing-config",
                                   "items": [{"key": "consolidate.yaml", "path": "consolidate.yaml"}]}
    service = one(docs, "Service", "vgpu-consolidate-metrics")
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}]
    # the ServiceMonitor scrapes it with the other metrics Services
    monitor = one(render({"consolidation": CONSOLIDATION, "monitoring": {"serviceMonitor": {"enabled": True}}}),
                  "ServiceMonitor", "vgpu-sharing")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert ("Service", "vgpu-consolidate-metrics") not in keys(render({
        "consolidation": CONSOLIDATION, "monitoring": {"metricsServices": {"enabled": False}}}))


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def test_the_consolidation_controller_plans_with_the_extenders_configuration(tmp_path):
    """consolidate.yaml through the loader `vgpu consolidate` uses: the sharing section of scheduler.yaml, and the
    node policy, GPU policy and schedulerName the extender is given as flags."""
    from vgpu.scheduler.config import load_config

    values = {"consolidation": {"enabled": True}, "sharing": {"split_count": 4, "hami_names": "off"},
              "scheduler": {"schedulerName": "gpu-share", "extender": {"nodePolicy": "binpack", "gpuPolicy": "spread"}}}
    docs = render(values)
    data = one(docs, "ConfigMap", "vgpu-sharing-config")["data"]
    for key in ("scheduler.yaml", "consolidate.yaml"):
        (tmp_path / key).write_text(data[key])
    extender = containers(one(docs, "Deployment", "vgpu-scheduler"))["extender"]["command"]
    assert {"--node-policy=binpack", "--gpu-policy=spread", "--scheduler-names=gpu-share"} <= set(extender)
    config = load_config(str(tmp_path / "consolidate.yaml"), {"scheduler_names": None})
    assert (config.node_policy, config.gpu_policy, config.scheduler_names) == ("binpack", "spread", ["gpu-share"])
    assert config.sharing == load_config(str(tmp_path / "scheduler.yaml"), {}).sharing
    assert config.sharing.split_count == 4 and config.sharing.hami_mode() == "off"
    # the extender's default GPU policy when the values name none
    default = one(render({"consolidation": {"enabled": True}}), "ConfigMap", "vgpu-sharing-config")["data"]
    assert yaml.safe_load(default["consolidate.yaml"])["node_policy"] == "fragaware"
    assert "gpu_policy" not in yaml.safe_load(default["consolidate.yaml"])


def test_the_consolidation_controllers_rights_are_exactly_what_it_calls():
    """The rules, verb by verb (test_deploy_rbac.py runs the controller and compares its calls with them)."""
    docs = render({"consolidation": {"enabled": True}})
    rules = one(docs, "ClusterRole", "vgpu-consolidate")["rules"]
    assert rules == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    binding = one(docs, "ClusterRoleBinding", "vgpu-consolidate")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "vgpu-consolidate"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vgpu-consolidate", "namespace": NAMESPACE}]
    elected = render({"consolidation": {"enabled": True, "replicas": 2}})
    role = one(elected, "Role", "vgpu-consolidate-lease")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["vgpu-consolidate"],
         "verbs": ["get", "update"]},
    ]
    role_binding = one(elected, "RoleBinding", "vgpu-consolidate-lease")
    assert role_binding["metadata"]["namespace"] == NAMESPACE
    assert role_binding["roleRef"]["name"] == "vgpu-consolidate-lease"
    assert role_binding["subjects"] == binding["subjects"]
    assert "--leader-elect" in containers(one(elected, "Deployment", "vgpu-consolidate"))["consolidate"]["command"]


@pytest.mark.parametrize("values", [
    {"interval": "30 seconds"}, {"pendingFor": "-5m"}, {"hold": "1w"}, {"moveShare": -0.1}, {"moveShare": "5%"},
    {"maxMoves": 0},
    {"replicas": -1}, {"logLevel": "verbose"}, {"metricsPort": 0}, {"pendingfor": "5m"},
], ids=lambda v: next(iter(v)))
def test_the_schema_refuses_malformed_consolidation_values(values):
    chart().validate_schema({"consolidation": {"enabled": True, "interval": 90, "minAge": "1.5h"}})
    with pytest.raises(helm.HelmValuesError):
        chart().validate_schema({"consolidation": {"enabled": True, **values}})


# ----------------------------------------------------------------------------------------- the certificates

def tls_files(secret: dict, directory: Path) -> dict[str, Path]:
    """The Secret's files written out, by key."""
    out = {}
    for key, value in secret["data"].items():
        out[key] = directory / key
        out[key].write_bytes(base64.b64decode(value))
    return out


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> None:
    """A TLS handshake between two contexts in memory; raises ssl.SSLError where either side refuses."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    client_side = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    done = set()
    for _ in range(20):
        for name, side, out, peer in (("client", client_side, c_out, s_in), ("server", server_side, s_out, c_in)):
            if name not in done:
                try:
                    side.do_handshake()
                    done.add(name)
                except ssl.SSLWantReadError:
                    pass
            peer.write(out.read())
        if done == {"client", "server"}:
            server_side.write(b"ok")
            c_in.write(s_out.read())
            assert client_side.read() == b"ok"
            return
    raise AssertionError(f"handshake unfinished: {done}")


def load_certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_generated_webhook_certificate_verifies(tmp_path):
    docs = render()
    secret = one(docs, "Secret", "vgpu-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    files = tls_files(secret, tmp_path)
    ca_bundle = one(docs, "MutatingWebhookConfiguration", "vgpu-webhook")["webhooks"][0]["clientConfig"]["caBundle"]
    (tmp_path / "bundle.pem").write_bytes(base64.b64decode(ca_bundle))
    ca, cert = load_certificate(tmp_path / "bundle.pem"), load_certificate(files["tls.crt"])
    assert ca == load_certificate(files["ca.crt"])
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == WEBHOOK_DNS
    assert ExtendedKeyUsageOID.SERVER_AUTH in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
    assert cert.not_valid_after_utc - now > datetime.timedelta(days=3000)  # webhook.tls.validityDays
    key = serialization.load_pem_private_key(files["tls.key"].read_bytes(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]
    # what the API server does: trust the caBundle, call the Service's DNS name
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files["tls.crt"], files["tls.key"])
    client = ssl.create_default_context(cafile=tmp_path / "bundle.pem")
    handshake(server, client, WEBHOOK_DNS[0])
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client, "vgpu-webhook.elsewhere.svc")
    # another render is another CA: this bundle does not trust its certificate
    (tmp_path / "other").mkdir()
    other = tls_files(one(render({"webhook": {"timeoutSeconds": 4}}), "Secret", "vgpu-webhook-tls"),
                      tmp_path / "other")
    foreign = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    foreign.load_cert_chain(other["tls.crt"], other["tls.key"])
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(foreign, client, WEBHOOK_DNS[0])


def test_the_generated_extender_certificate_serves_mutual_tls_on_loopback(tmp_path):
    """Both sides of kube-scheduler's tlsConfig and the extender's flags, with the one generated Secret."""
    secret = one(render({"scheduler": {"extender": {"tls": {"enabled": True}}}}), "Secret",
                 "vgpu-scheduler-extender-tls")
    files = tls_files(secret, tmp_path)
    cert = load_certificate(files["tls.crt"])
    cert.verify_directly_issued_by(load_certificate(files["ca.crt"]))
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    # the extender (scheduler/server.py): its certificate, client certificates required from the CA
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files["tls.crt"], files["tls.key"])
    server.load_verify_locations(files["ca.crt"])
    server.verify_mode = ssl.CERT_REQUIRED
    # kube-scheduler: caFile, certFile, keyFile, calling https://127.0.0.1:8888
    client = ssl.create_default_context(cafile=files["ca.crt"])
    client.load_cert_chain(files["tls.crt"], files["tls.key"])
    handshake(server, client, "127.0.0.1")
    anonymous = ssl.create_default_context(cafile=files["ca.crt"])
    with pytest.raises(ssl.SSLError):
        handshake(server, anonymous, "127.0.0.1")


# --------------------------------------------------------------------------------------------------- the notes

def test_notes_give_the_grant_key_commands():
    notes = render_files()[f"{RELEASE}/templates/NOTES.txt"]
    assert "openssl genpkey -algorithm ed25519 -out grant.key" in notes
    assert f"kubectl -n {NAMESPACE} create secret generic vgpu-grant-key --from-file=key=grant.key" in notes
    assert f"kubectl -n {NAMESPACE} create configmap vgpu-grant-public-keys --from-file=keys.pem=grant.pub" in notes
    with_keys = render_files({"grantKey": {"publicKeys": PUBLIC_PEM}})[f"{RELEASE}/templates/NOTES.txt"]
    assert "create configmap" not in with_keys


# ----------------------------------------------------------------------------------------------- the values

# Values whose content is free-form (maps and lists handed to Kubernetes or to the configuration as they are): the
# docs name the value itself, not its keys.
FREE_FORM = {"resources", "nodeSelector", "affinity", "tolerations", "config", "labels", "additionalLabels",
             "issuerRef", "sharing"}


def value_paths(values: dict, prefix: str = "") -> list[str]:
    """The dotted paths of values.yaml's settings (free-form values as one)."""
    out = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key not in FREE_FORM:
            out.extend(value_paths(value, path))
        else:
            out.append(path)
    return out


def test_every_value_is_in_the_install_guides_table_and_the_schema():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values == chart().values
    text = (ROOT / "docs" / "install.md").read_text()
    section = text[text.index("### Chart values"):]
    section = section[:section.index("\n## ")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in row.split(" | ")[0].strip("| ").replace("`", "").split(", ")}
    paths = value_paths(values)
    assert set(paths) == named, (sorted(set(paths) - named), sorted(named - set(paths)))
    schema = chart().schema
    assert schema is not None
    for path in paths:
        node = schema
        for part in path.split("."):
            node = node["properties"][part]
