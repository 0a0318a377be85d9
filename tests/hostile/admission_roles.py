"""Who does what in the hostile suite, with and without deploy/admission's ValidatingAdmissionPolicies.

Without the policies every client is a cluster admin (the stand-in authenticates nobody): what stops an attack is
the device plugin, the extender or the library.  With them, the API-server stand-in authenticates each client by its
token as kube-apiserver would (the tenant as a user, our scheduler and device plugin as their ServiceAccounts, the
plugin's token bound to a pod on its node) and evaluates the shipped policies on every write (testbed/admission.py),
so an attack may already end at the API server, with the policy's message.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS / "deploy") not in sys.path:
    sys.path.insert(0, str(TESTS / "deploy"))

from deploy_helpers import DEPLOY, load_manifests  # noqa: E402

from vgpu.kube.client import make_api_client  # noqa: E402
from vgpu.testbed.admission import POLICY_PLURALS, UserInfo  # noqa: E402

SA = "system:serviceaccount:vgpu-system:{}"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
MODES = ("without-policies", "with-policies")


@dataclass
class Roles:
    """The API clients of one test: the tenant's, our scheduler's; `enforced` when the policies are in force."""

    enforced: bool
    tenant: k8s.CoreV1Api
    scheduler: Any  # ApiClient

    def refused(self, call: Any, *args: Any, **kwargs: Any) -> str:
        """Run a tenant's write that the policies must refuse; the refusal's message."""
        assert self.enforced
        with pytest.raises(ApiException) as caught:
            call(*args, **kwargs)
        assert caught.value.status == 403, caught.value.body
        assert "ValidatingAdmissionPolicy" in str(caught.value.body), caught.value.body
        return str(caught.value.body)


def policy_documents() -> list[dict[str, Any]]:
    """deploy/admission's ValidatingAdmissionPolicies and their bindings, as parsed YAML."""
    return [m.doc for m in load_manifests(sorted((DEPLOY / "admission").glob("*.yaml")))]


def enforce_policies(apiserver: Any, workdir: Path, admin_token: str, node: str) -> dict[str, str]:
    """Load deploy/admission's policies into the stand-in and authenticate its clients from now on; the kubeconfig
    path of each role: admin (the token the caller already uses), tenant, scheduler, plugin (bound to `node`)."""
    objects = k8s.CustomObjectsApi(make_api_client(apiserver.write_kubeconfig(workdir / "kubeconfig-admin",
                                                                              admin_token)))
    for doc in policy_documents():
        objects.create_cluster_custom_object("admissionregistration.k8s.io", "v1", POLICY_PLURALS[doc["kind"]], doc)
    sa_groups = ("system:serviceaccounts", "system:serviceaccounts:vgpu-system", "system:authenticated")
    users = {
        admin_token: UserInfo("kubernetes-admin", groups=("system:masters", "system:authenticated")),
        "tenant-token": UserInfo("alice@example.com", groups=("tenants", "system:authenticated")),
        "scheduler-token": UserInfo(SA.format("vgpu-scheduler-extender"), groups=sa_groups),
        "plugin-token": UserInfo(SA.format("vgpu-device-plugin"), groups=sa_groups,
                                 extra={NODE_NAME_CLAIM: (node,)}),
    }
    apiserver.authenticate(users)
    paths = {role: apiserver.write_kubeconfig(workdir / f"kubeconfig-{role}", f"{role}-token")
             for role in ("tenant", "scheduler", "plugin")}
    paths["admin"] = apiserver.write_kubeconfig(workdir / "kubeconfig-admin", admin_token)  # stays its .kubeconfig
    return paths
