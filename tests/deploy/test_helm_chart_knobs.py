"""The chart's knobs beside HAMi's (issue 47): global.imageRegistry, nameOverride / fullnameOverride /
namespaceOverride, devicePlugin.nodeConfiguration (read by the real device plugin's parser), runtimeClassName and
the RuntimeClass, the webhook's namespaceSelector and objectSelector, and the kube-scheduler tag taken from the
cluster's version. Every render goes through Helm's own engine at a given cluster version, its objects are
validated against the Kubernetes 1.30 and 1.34 schemas, and every reference between objects is resolved, so that a
renamed object leaves no dangling name behind."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from cryptography import x509
from deploy_helpers import NAMESPACE, Manifest, assert_valid_kubernetes
from test_helm_chart import CHART, RELEASE, by_key, one, render_chart

from vgpu.deviceplugin.config import resolve_config
from vgpu.deviceplugin.nodeconfig import node_entry

OLDEST, NEWEST = "v1.30.0", "v1.34.0"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "MutatingWebhookConfiguration", "DeviceClass", "RuntimeClass"}
# Objects of the user, or of Kubernetes, that our objects name without making them.
EXTERNAL = {("Secret", "vgpu-grant-key"), ("ConfigMap", "vgpu-grant-public-keys"), ("ConfigMap", "kube-root-ca.crt")}
# Everything on: the objects of every toggle at once (DRA needs 1.34).
EVERYTHING = {
    "dra": {"enabled": True},
    "devicePlugin": {"simulated": {"enabled": True}, "runtimeClassName": "nvidia", "createRuntimeClass": True,
                     "nodeConfiguration": [{"name": "gpu-1", "splitCount": 4, "filterDevices": {"index": [1]}}]},
    "scheduler": {"replicas": 2, "extender": {"tls": {"enabled": True}}},
    "webhook": {"networkPolicy": {"enabled": True, "from": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]},
                "namespaceSelector": {"matchLabels": {"gpu": "yes"}},
                "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}},
    "monitoring": {"dashboard": {"enabled": True}},
    "consolidation": {"enabled": True, "replicas": 2},
}


def objects(values: dict | None = None, kube_version: str = NEWEST, name: str = RELEASE,
            namespace: str = NAMESPACE) -> list[dict]:
    """The objects of a render (NOTES.txt aside)."""
    rendered = render_chart(values, name=name, namespace=namespace, kube_version=kube_version)
    return [d for path, text in sorted(rendered.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text)
            if d]


def notes(values: dict | None = None, **kwargs) -> str:
    rendered = render_chart(values, **kwargs)
    (text,) = [t for p, t in rendered.items() if p.endswith("NOTES.txt")]
    return text




def workloads(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "DaemonSet")}


def containers(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["spec"]["template"]["spec"]["containers"]}


def images(docs: list[dict]) -> set[str]:
    return {c["image"] for d in workloads(docs).values() for c in containers(d).values()}


def validate(docs: list[dict], version: str, label: str) -> None:
    """Every Kubernetes object valid for that version (strict); the CRD kinds (ServiceMonitor, cert-manager's)
    are checked in test_helm_chart.py."""
    for i, doc in enumerate(docs):
        if doc["apiVersion"].endswith((".coreos.com/v1", "cert-manager.io/v1")):
            continue
        assert_valid_kubernetes(Manifest(Path(label), i, doc), version.lstrip("v").rsplit(".", 1)[0])


def username(part: str, prefix: str, namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:{prefix}-{part}"


def assert_references_resolve(docs: list[dict], prefix: str, namespace: str) -> None:
    """Every name one of our objects gives of another is an object of the render (or the user's / Kubernetes'),
    in the namespace it is looked for in, and every selector picks a pod template of ours."""
    have = by_key(docs)
    namespaced = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs}

    def exists(kind: str, name: str, ns: str | None = namespace) -> None:
        assert (kind, name) in EXTERNAL or (kind, ns, name) in namespaced or \
            (kind in CLUSTER_SCOPED and (kind, name) in have), (kind, ns, name)

    def config_map(source: dict) -> None:
        """A ConfigMap a volume names exists, with every key the volume picks (when it is ours)."""
        exists("ConfigMap", source["name"])
        data = have[("ConfigMap", source["name"])]["data"] if ("ConfigMap", source["name"]) in have else None
        for item in source.get("items", ()):
            assert data is None or item["key"] in data, (source["name"], item["key"])

    templates = {}
    for name, doc in workloads(docs).items():
        pod = doc["spec"]["template"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), name
        templates[name] = pod
        exists("ServiceAccount", pod["spec"]["serviceAccountName"])
        for volume in pod["spec"].get("volumes", []):
            if "configMap" in volume:
                config_map(volume["configMap"])
            if "secret" in volume and not volume["secret"]["secretName"].startswith("my-"):
                exists("Secret", volume["secret"]["secretName"])
            for source in volume.get("projected", {}).get("sources", []):
                if "configMap" in source:
                    config_map(source["configMap"])
                if "secret" in source:
                    exists("Secret", source["secret"]["name"])
        if "runtimeClassName" in pod["spec"] and ("RuntimeClass", pod["spec"]["runtimeClassName"]) not in have:
            pytest.fail(f"{name}: RuntimeClass {pod['spec']['runtimeClassName']} not made (createRuntimeClass off?)")

    def selects(selector: dict) -> bool:
        return any(selector.items() <= t["metadata"]["labels"].items() for t in templates.values())

    for doc in docs:
        kind, spec = doc["kind"], doc.get("spec", {})
        if kind in ("RoleBinding", "ClusterRoleBinding"):
            if not doc["roleRef"]["name"].startswith(("system:", "extension-apiserver")):
                exists(doc["roleRef"]["kind"], doc["roleRef"]["name"], doc["metadata"].get("namespace"))
            for subject in doc["subjects"]:
                exists("ServiceAccount", subject["name"], subject["namespace"])
        elif kind == "Service":
            assert selects(spec["selector"]), doc["metadata"]["name"]
        elif kind in ("NetworkPolicy",):
            assert selects(spec["podSelector"]["matchLabels"])
        elif kind == "PodDisruptionBudget":
            assert selects(spec["selector"]["matchLabels"])
        elif kind == "ValidatingAdmissionPolicyBinding":
            exists("ValidatingAdmissionPolicy", spec["policyName"])
        elif kind == "MutatingWebhookConfiguration":
            service = doc["webhooks"][0]["clientConfig"]["service"]
            exists("Service", service["name"], service["namespace"])
            if "annotations" in doc["metadata"]:
                ns, name = doc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
                exists("Certificate", name, ns)
        elif kind == "Secret" and doc["type"] == "kubernetes.io/service-account-token":
            exists("ServiceAccount", doc["metadata"]["annotations"]["kubernetes.io/service-account.name"])
        elif kind == "Deployment" and doc["metadata"]["name"].endswith("-webhook"):
            spread = spec["template"]["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]
            assert selects(spread)
    # the policies' usernames are those of our ServiceAccounts
    text = json.dumps([d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"])
    for part in ("scheduler-extender", "device-plugin"):
        assert username(part, prefix, namespace) in text
        exists("ServiceAccount", f"{prefix}-{part}")
    # one Lease, named alike by kube-scheduler's configuration, the extender's flag and both Roles
    lease = f"{prefix}-kube-scheduler"
    config = yaml.safe_load(have[("ConfigMap", f"{prefix}-scheduler-config")]["data"]["config.yaml"])
    assert (config["leaderElection"]["resourceName"], config["leaderElection"]["resourceNamespace"]) == \
        (lease, namespace)
    extender = containers(have[("Deployment", f"{prefix}-scheduler")])["extender"]
    assert f"--follow-lease={namespace}/{lease}" in extender["command"]
    for role in (f"{prefix}-kube-scheduler-lease", f"{prefix}-scheduler-extender-lease"):
        assert have[("Role", role)]["rules"][0]["resourceNames"] == [lease]


# ------------------------------------------------------------------------------------------------- the names

def test_default_names_resolve_and_keep_deploys_prefix():
    docs = objects(EVERYTHING)
    assert_references_resolve(docs, "vgpu", NAMESPACE)
    ours = [d["metadata"]["name"] for d in docs if d["kind"] not in ("DeviceClass", "RuntimeClass")]
    assert all(name.startswith("vgpu-") for name in ours), ours


@pytest.mark.parametrize("values, release, prefix", [
    ({"fullnameOverride": "gpu"}, RELEASE, "gpu"),
    ({"nameOverride": "share"}, "team-a", "team-a-share"),
    ({"nameOverride": "share"}, "share-prod", "share-prod"),  # the release name already holds it
    ({"nameOverride": "share", "fullnameOverride": "gpu"}, RELEASE, "gpu"),  # fullnameOverride wins
], ids=["fullname", "name", "name-in-release", "both"])
def test_a_prefix_renames_every_object_and_every_reference(values, release, prefix):
    # the profile's schedulerName is what pods name, a value of its own (default vgpu-scheduler): moved out of the
    # way here so that any name left of the default prefix shows
    scheduler = {**EVERYTHING["scheduler"], "schedulerName": "gpu-share"}
    docs = objects({**EVERYTHING, **values, "scheduler": scheduler}, name=release)
    assert_references_resolve(docs, prefix, NAMESPACE)
    for doc in docs:
        if doc["kind"] not in ("DeviceClass", "RuntimeClass"):
            assert doc["metadata"]["name"].startswith(prefix + "-"), doc["metadata"]["name"]
    # no object name of the default prefix is left anywhere (labels, flags, RBAC subjects, policies, ...)
    text = json.dumps(docs).replace("/etc/vgpu-", "/etc/")  # paths inside the containers are no object names
    for old in ("vgpu-scheduler", "vgpu-kube-scheduler", "vgpu-device-plugin", "vgpu-dra-plugin", "vgpu-webhook",
                "vgpu-sharing-config", "vgpu-sharing-assignment", "vgpu-sharing-dashboard"):
        assert f'"{old}' not in text and f"/{old}" not in text and f":{old}" not in text, old
    # the webhook's certificate names the renamed Service
    secret = one(docs, "Secret", f"{prefix}-webhook-tls")
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName)[0] == f"{prefix}-webhook.{NAMESPACE}.svc"
    assert f"deployment/{prefix}-scheduler" in notes({**EVERYTHING, **values}, name=release)


def test_namespace_override_moves_every_namespaced_object_and_reference():
    docs = objects({**EVERYTHING, "namespaceOverride": "gpu-system"})
    assert_references_resolve(docs, "vgpu", "gpu-system")
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta
        elif meta["name"] != "vgpu-kube-scheduler-authentication-reader":
            assert meta["namespace"] == "gpu-system", (doc["kind"], meta["name"])
    assert NAMESPACE not in json.dumps(docs)
    hook = one(docs, "MutatingWebhookConfiguration", "vgpu-webhook")["webhooks"][0]
    assert hook["clientConfig"]["service"]["namespace"] == "gpu-system"
    assert "gpu-system" in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    text = notes({"namespaceOverride": "gpu-system"})
    assert "kubectl -n gpu-system create secret generic vgpu-grant-key" in text


def test_the_schema_refuses_names_kubernetes_would():
    chart = helm.Chart.load(CHART)
    for values in ({"fullnameOverride": "GPU"}, {"nameOverride": "a_b"}, {"namespaceOverride": "-x"},
                   {"fullnameOverride": "x" * 41}, {"global": {"imageRegistry": "reg.example.com/ x"}}):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(values)


# ------------------------------------------------------------------------------------------------ the images

@pytest.mark.parametrize("registry, ours, scheduler", [
    ("mirror.example.com", "mirror.example.com/vgpu-sharing/vgpu:0.1.0", "mirror.example.com/kube-scheduler:v1.34.0"),
    ("mirror.example.com:5000/k8s/", "mirror.example.com:5000/k8s/vgpu-sharing/vgpu:0.1.0",
     "mirror.example.com:5000/k8s/kube-scheduler:v1.34.0"),
    ("", "vgpu-sharing/vgpu:0.1.0", "registry.k8s.io/kube-scheduler:v1.34.0"),
])
def test_global_image_registry_reaches_both_images(registry, ours, scheduler):
    assert images(objects({**EVERYTHING, "global": {"imageRegistry": registry}})) == {ours, scheduler}


def test_global_image_registry_with_a_repository_that_names_a_registry():
    docs = objects({"global": {"imageRegistry": "mirror.local"},
                    "image": {"repository": "localhost/vgpu", "tag": "1.0"},
                    "scheduler": {"kubeScheduler": {"image": {"repository": "kube-scheduler", "tag": "v1.33.1"}}}})
    assert images(docs) == {"mirror.local/vgpu:1.0", "mirror.local/kube-scheduler:v1.33.1"}


@pytest.mark.parametrize("kube_version, tag", [
    ("v1.30.0", "v1.30.0"),
    ("v1.31.4", "v1.31.4"),
    ("1.32.2", "v1.32.2"),
    ("v1.30.0+k3s1", "v1.30.0"),
    ("v1.31.4-eks-1552ad0", "v1.31.4"),
    ("v1.33.5-gke.1080000", "v1.33.5"),
    ("v1.35.0-alpha.1", "v1.35.0-alpha.1"),
    ("v1.36.0-rc.0+abc", "v1.36.0-rc.0"),
])
def test_the_kube_scheduler_tag_is_the_clusters_version(kube_version, tag):
    assert f"registry.k8s.io/kube-scheduler:{tag}" in images(objects(kube_version=kube_version))
    pinned = {"scheduler": {"kubeScheduler": {"image": {"tag": "v1.30.9"}}}}
    assert "registry.k8s.io/kube-scheduler:v1.30.9" in images(objects(pinned, kube_version=kube_version))


def test_the_default_tag_is_empty_and_the_values_say_why():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["scheduler"]["kubeScheduler"]["image"]["tag"] == ""
    assert "Capabilities.KubeVersion" in (CHART / "values.yaml").read_text()


# ------------------------------------------------------------------------------------ per-node configuration

NODES = [
    {"name": "gpu-1", "splitCount": 4, "filterDevices": {"uuid": ["GPU-aaaa"], "index": [3]}},
    {"name": "gpu-2", "splitCount": 2, "memoryScaling": 1},
]


def test_node_configuration_reaches_both_device_plugins_and_their_parser(tmp_path):
    docs = objects({"devicePlugin": {"simulated": {"enabled": True}, "nodeConfiguration": NODES}})
    config_map = one(docs, "ConfigMap", "vgpu-device-plugin-nodes")
    path = tmp_path / "nodes.yaml"
    path.write_text(config_map["data"]["nodes.yaml"])
    entry = node_entry(str(path), "gpu-1")
    assert entry is not None and (entry.split_count, entry.exclude_devices()) == (4, ["GPU-aaaa", "3"])
    # the plugin's own resolution, as the DaemonSet's command line gives it
    config = resolve_config(None, {"node_name": "gpu-2", "node_config": str(path)}, {})
    assert config.sharing.split_count == 2
    assert resolve_config(None, {"node_name": "cpu-9", "node_config": str(path)}, {}).sharing.split_count == 10
    checksums = set()
    for name in ("vgpu-device-plugin", "vgpu-device-plugin-sim"):
        pod = one(docs, "DaemonSet", name)["spec"]["template"]
        (c,) = containers(one(docs, "DaemonSet", name)).values()
        assert "--node-config=/etc/vgpu-node-config/nodes.yaml" in c["command"]
        assert {"name": "node-config", "mountPath": "/etc/vgpu-node-config", "readOnly": True} in c["volumeMounts"]
        assert {"name": "node-config", "configMap": {"name": "vgpu-device-plugin-nodes"}} in pod["spec"]["volumes"]
        checksums.add(pod["metadata"]["annotations"]["checksum/node-configuration"])
    assert len(checksums) == 1
    other = objects({"devicePlugin": {"simulated": {"enabled": True}, "nodeConfiguration": NODES[:1]}})
    pod = one(other, "DaemonSet", "vgpu-device-plugin")["spec"]["template"]
    assert pod["metadata"]["annotations"]["checksum/node-configuration"] not in checksums  # a change restarts them


def test_without_node_configuration_nothing_changes():
    docs = objects()
    assert ("ConfigMap", "vgpu-device-plugin-nodes") not in by_key(docs)
    pod = one(docs, "DaemonSet", "vgpu-device-plugin")["spec"]["template"]
    assert "annotations" not in pod["metadata"]
    assert not [a for a in containers(one(docs, "DaemonSet", "vgpu-device-plugin"))["device-plugin"]["command"]
                if a.startswith("--node-config")]


def test_the_node_configuration_command_line_parses():
    from vgpu.cli import build_parser

    (c,) = containers(one(objects({"devicePlugin": {"nodeConfiguration": NODES}}), "DaemonSet",
                          "vgpu-device-plugin")).values()
    args = build_parser().parse_args(c["command"][1:])
    assert args.node_config == "/etc/vgpu-node-config/nodes.yaml"


@pytest.mark.parametrize("entries, message", [
    ([{"name": "gpu-1", "memoryScaling": 1.5}], "memoryScaling 1.5 is not supported: vgpu-sharing never"),
    ([{"name": "gpu-1", "memoryScaling": 2}], "(node gpu-1): memoryScaling 2 is not supported"),
    ([{"name": "gpu-1"}, {"name": "gpu-1", "splitCount": 2}], "node gpu-1 has two entries"),
])
def test_the_chart_refuses_node_configuration_the_plugin_would(entries, message):
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        objects({"devicePlugin": {"nodeConfiguration": entries}})


@pytest.mark.parametrize("entry", [
    {"splitCount": 4},  # no name
    {"name": "gpu-1", "splitCount": 0},
    {"name": "gpu-1", "splitCount": 1001},
    {"name": "gpu-1", "devicesplitcount": 4},  # HAMi's spelling: the chart's values use ours
    {"name": "gpu-1", "filterDevices": {"index": [-1]}},
    {"name": "gpu-1", "filterDevices": {"uuid": ["GPU-a,GPU-b"]}},
    {"name": "gpu-1", "filterDevices": {"serial": ["x"]}},
])
def test_the_schema_refuses_a_malformed_entry(entry):
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema({"devicePlugin": {"nodeConfiguration": [entry]}})


# -------------------------------------------------------------------------------------------- runtime classes

def test_runtime_class_name_on_the_nvml_agents_only():
    docs = objects({"dra": {"enabled": True}, "devicePlugin": {"simulated": {"enabled": True},
                                                                "runtimeClassName": "nvidia"}})
    pods = {name: d["spec"]["template"]["spec"] for name, d in workloads(docs).items()}
    assert pods["vgpu-device-plugin"]["runtimeClassName"] == "nvidia"
    assert pods["vgpu-dra-plugin"]["runtimeClassName"] == "nvidia"
    for name in ("vgpu-device-plugin-sim", "vgpu-scheduler", "vgpu-webhook"):
        assert "runtimeClassName" not in pods[name], name
    assert not [d for d in docs if d["kind"] == "RuntimeClass"]  # it exists already (createRuntimeClass off)
    dra_own = objects({"dra": {"enabled": True, "runtimeClassName": "nvidia-cdi"},
                       "devicePlugin": {"runtimeClassName": "nvidia"}})
    assert workloads(dra_own)["vgpu-dra-plugin"]["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia-cdi"
    assert "runtimeClassName" not in workloads(objects())["vgpu-device-plugin"]["spec"]["template"]["spec"]


def test_create_runtime_class():
    docs = objects({"devicePlugin": {"runtimeClassName": "nvidia", "createRuntimeClass": True}})
    runtime_class = one(docs, "RuntimeClass", "nvidia")
    assert runtime_class["handler"] == "nvidia" and runtime_class["apiVersion"] == "node.k8s.io/v1"
    assert "namespace" not in runtime_class["metadata"]
    with pytest.raises(helm.HelmRenderError, match=re.escape("createRuntimeClass needs devicePlugin.runtimeClassName")):
        objects({"devicePlugin": {"createRuntimeClass": True}})


# ------------------------------------------------------------------------------------------- webhook selectors

def test_webhook_selectors_merge_with_the_excluded_namespaces():
    docs = objects({"webhook": {"excludeNamespaces": ["batch"],
                                "namespaceSelector": {
                                    "matchLabels": {"gpu": "yes"},
                                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["ml"]}]},
                                "objectSelector": {"matchLabels": {"vgpu": "on"}}}})
    (hook,) = one(docs, "MutatingWebhookConfiguration", "vgpu-webhook")["webhooks"]
    assert hook["namespaceSelector"] == {
        "matchLabels": {"gpu": "yes"},
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
             "values": ["kube-system", "kube-public", "kube-node-lease", NAMESPACE, "batch"]},
            {"key": "tier", "operator": "In", "values": ["ml"]}]}
    assert hook["objectSelector"] == {"matchLabels": {"vgpu": "on"}}
    (plain,) = one(objects(), "MutatingWebhookConfiguration", "vgpu-webhook")["webhooks"]
    assert set(plain["namespaceSelector"]) == {"matchExpressions"} and "objectSelector" not in plain


def test_the_schema_refuses_a_malformed_selector():
    chart = helm.Chart.load(CHART)
    for selector in ({"matchLabel": {"a": "b"}}, {"matchExpressions": [{"key": "a", "operator": "Is"}]},
                     {"matchLabels": {"a": 1}}):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema({"webhook": {"namespaceSelector": selector}})
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema({"webhook": {"objectSelector": selector}})


# ------------------------------------------------------------------------------- two Kubernetes versions

WITHOUT_DRA = {**EVERYTHING, "dra": {"enabled": False}}


@pytest.mark.parametrize("kube_version, values", [
    (OLDEST, WITHOUT_DRA),  # resource.k8s.io/v1 (DRA mode) exists from 1.34 only
    (OLDEST, {**WITHOUT_DRA, "fullnameOverride": "gpu", "namespaceOverride": "gpu-system",
              "global": {"imageRegistry": "mirror.example.com"}}),
    (NEWEST, EVERYTHING),
    (NEWEST, {**EVERYTHING, "nameOverride": "share", "namespaceOverride": "gpu-system"}),
], ids=["1.30", "1.30-renamed", "1.34", "1.34-renamed"])
def test_every_knob_renders_valid_objects_and_lints(kube_version, values, no_network):
    docs = objects(values, kube_version=kube_version)
    validate(docs, kube_version, f"chart@{kube_version}")
    tag = kube_version
    assert any(image.endswith(f"/kube-scheduler:{tag}") for image in images(docs)), images(docs)
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=kube_version)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report
