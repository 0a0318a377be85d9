"""Shared loaders for the deploy/ and docs/ checks: the manifests of deploy/ as parsed YAML documents."""

from dataclasses import dataclass
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCS = ROOT / "docs"
NAMESPACE = "vgpu-system"
DRA = DEPLOY / "dra"
WEBHOOK = DEPLOY / "webhook"


@dataclass(frozen=True, slots=True)
class Manifest:
    """One YAML document of a file under deploy/."""

    path: Path
    index: int
    doc: dict

    @property
    def id(self) -> str:
        """`file#index kind/name`, for test ids and messages."""
        rel = self.path.relative_to(DEPLOY) if self.path.is_relative_to(DEPLOY) else self.path
        return f"{rel}#{self.index} {self.doc.get('kind')}/{self.doc.get('metadata', {}).get('name')}"


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest file under deploy/ (kustomization files are not objects): the base install, the
    monitoring add-on and the webhook add-on.

    deploy/dra/ is left out on purpose: DRA mode is an add-on for Kubernetes 1.34 and later (resource.k8s.io/v1 has
    no schema before), while the base install is also checked against older releases; test_deploy_dra.py checks it."""
    return sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml" and not p.is_relative_to(DRA))


def base_manifest_files() -> list[Path]:
    """manifest_files() without the webhook add-on, deploy/webhook/: it needs cert-manager (its Certificate and
    Issuer have no schema in any Kubernetes release) and holds a cluster-scoped MutatingWebhookConfiguration;
    test_helm_chart.py checks it (schemas, cert-manager kinds by hand, equal to the chart's webhook)."""
    return [p for p in manifest_files() if not p.is_relative_to(WEBHOOK)]


def load_manifests(files: list[Path] | None = None) -> list[Manifest]:
    """Every non-empty YAML document of every manifest file of `files`, by default of base_manifest_files()."""
    out = []
    for path in base_manifest_files() if files is None else files:
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                out.append(Manifest(path, i, doc))
    return out


def find(kind: str, name: str) -> dict:
    """The one manifest of that kind and name."""
    hits = [m.doc for m in load_manifests() if m.doc["kind"] == kind and m.doc["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name=value` in a command line, or None; giving it twice is an error."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(values) <= 1, f"--{name} given {len(values)} times in {args}"
    return values[0] if values else None


def mounted_file(kind: str, name: str, container: str, path: str) -> tuple[str, str, str]:
    """(source kind, name, key) of the file at `path` in a workload's container: a Secret or ConfigMap volume
    mounted read-only there, e.g. ("Secret", "vgpu-grant-key", "key")."""
    pod = find(kind, name)["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == container]
    directory, file = path.rsplit("/", 1)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == directory]
    assert mount.get("readOnly") is True, mount
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    if "secret" in volume:
        source, source_name = "Secret", volume["secret"]["secretName"]
        items = volume["secret"].get("items", ())
    else:
        source, source_name = "ConfigMap", volume["configMap"]["name"]
        items = volume["configMap"].get("items", ())
    return source, source_name, {i["path"]: i["key"] for i in items}.get(file, file)


def assert_valid_kubernetes(manifest: Manifest, version: str) -> None:
    """Fail the test unless `manifest` is valid for Kubernetes `version` (kubernetes-validate, offline, strict: unknown
    fields are errors), naming the field."""
    error = None
    try:
        kubernetes_validate.validate(manifest.doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        error = f"at {'.'.join(str(p) for p in exc.path)}: {exc.message}"
    if error:
        pytest.fail(f"{manifest.id} invalid for Kubernetes {version} {error}")
