"""The API-server stand-in's mutating admission webhooks (testbed/webhooks.py), held to what kube-apiserver does
(staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook: mutating/dispatcher.go, generic/webhook.go,
request/admissionreview.go, errors/statuserror.go), driven through the real `kubernetes` client and kubectl.

The webhook server is written here: a small HTTPS server (a CA and a serving certificate made with `cryptography`)
answering AdmissionReviews with what each test asks of each path. It is not the product's webhook.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from capabilities import tool
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from vgpu.kube.client import make_api_client, read_json
from vgpu.testbed.admission import POLICY_PLURALS
from vgpu.testbed.apiserver import ApiServerStandIn

NS, SVC = "webhooks", "hook"  # the webhook's Service, reached through the stand-in's service_resolver
Answer = Callable[[dict[str, Any]], dict[str, Any]]


# ------------------------------------------------------------------------------------------------ the certificates

def _ca(name: str) -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Any]:
    """A CA, a serving certificate it signed (localhost, 127.0.0.1, hook.webhooks.svc) and an unrelated CA."""
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca = _ca("webhook-test-ca")
    _, stranger = _ca("some-other-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hook")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.DNSName(f"{SVC}.{NS}.svc"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))

    def bundle(c: x509.Certificate) -> str:
        return base64.b64encode(c.public_bytes(serialization.Encoding.PEM)).decode()

    return {"crt": folder / "tls.crt", "key": folder / "tls.key", "ca": bundle(ca), "stranger": bundle(stranger)}


# ------------------------------------------------------------------------------------------------ the webhook server

class HookServer(ThreadingHTTPServer):
    """HTTPS; POST <path> answers the AdmissionReview with `answers[path](request)` (a response without uid gets the
    request's); every review received is kept in `seen` as (path, request)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (a timed-out call) is no error worth a traceback."""

    def __init__(self, pki: dict[str, Any]) -> None:
        super().__init__(("127.0.0.1", 0), _HookHandler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(pki["crt"], pki["key"])
        self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.answers: dict[str, Answer] = {}
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def calls(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [req for p, req in self.seen if p == path]


class _HookHandler(BaseHTTPRequestHandler):
    server: HookServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path, _, query = self.path.partition("?")
        request = review["request"]
        with self.server.lock:
            self.server.seen.append((path, {**request, "_query": query, "_apiVersion": review.get("apiVersion")}))
        response = {"uid": request["uid"], **self.server.answers[path](request)}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def allow(request: dict[str, Any]) -> dict[str, Any]:
    return {"allowed": True}


def patching(*ops: dict[str, Any], warnings: tuple[str, ...] = ()) -> Answer:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"allowed": True, "patchType": "JSONPatch",
                               "patch": base64.b64encode(json.dumps(list(ops)).encode()).decode()}
        if warnings:
            out["warnings"] = list(warnings)
        return out
    return answer


# ---------------------------------------------------------------------------------------------------- the cluster

@pytest.fixture
def hooks(pki) -> Iterator[HookServer]:
    server = HookServer(pki)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def cluster(hooks, tmp_path) -> Iterator[ApiServerStandIn]:
    srv = ApiServerStandIn(service_resolver={(NS, SVC, 443): ("127.0.0.1", hooks.port)}).start()
    srv.write_kubeconfig(tmp_path / "kubeconfig")
    yield srv
    srv.stop()


def _api(srv: ApiServerStandIn) -> k8s.ApiClient:
    """A client that does not retry: each refusal is the first answer, each webhook called once per request."""
    return make_api_client(srv.kubeconfig, retries=False)


def _webhook(name: str, path: str, ca: str, **fields: Any) -> dict[str, Any]:
    """A webhook on pod creation, served by `hooks` at `path` through the Service."""
    return {"name": name, "clientConfig": {"service": {"namespace": NS, "name": SVC, "path": path}, "caBundle": ca},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "sideEffects": "None", "admissionReviewVersions": ["v1"], **fields}


def _install(srv: ApiServerStandIn, name: str, *webhooks: dict[str, Any]) -> None:
    objects = k8s.CustomObjectsApi(_api(srv))
    objects.create_cluster_custom_object("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name}, "webhooks": list(webhooks)})


def _pod(name: str, labels: dict[str, str] | None = None, resources: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources or {}}]}}


def _create(srv: ApiServerStandIn, body: dict[str, Any], ns: str = "default", **kw: Any) -> dict[str, Any]:
    """Create a pod; the object the server answered (ApiException when refused)."""
    return read_json(k8s.CoreV1Api(_api(srv)).create_namespaced_pod(
        ns, body, _preload_content=False, **kw))


def _refusal(srv: ApiServerStandIn, body: dict[str, Any], **kw: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as caught:
        _create(srv, body, **kw)
    return caught.value.status, json.loads(caught.value.body)


def _kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubectl", "https://kubernetes.io/docs/tasks/tools/"), "--kubeconfig", kubeconfig,
                           *args], input=stdin, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------------------------------------------- the tests

def test_a_patch_is_applied_and_the_review_is_kube_apiservers(cluster, hooks, pki):
    hooks.answers["/label"] = patching({"op": "add", "path": "/metadata/labels/mutated", "value": "yes"},
                                       warnings=('a "quoted" \\ warning', 'a "quoted" \\ warning', "another"))
    _install(cluster, "labeller", _webhook("label.example.com", "/label", pki["ca"]))
    answer = k8s.CoreV1Api(_api(cluster)).create_namespaced_pod("default", _pod("p"),
                                                                                      _preload_content=False)
    # the warning recorder: each text once, as `299 - "<text>"` with quotes and backslashes escaped
    assert answer.headers.getlist("Warning") == ['299 - "a \\"quoted\\" \\\\ warning"', '299 - "another"']
    created = read_json(answer)
    assert created["metadata"]["labels"] == {"mutated": "yes"}
    stored = k8s.CoreV1Api(_api(cluster)).read_namespaced_pod("p", "default")
    assert stored.metadata.labels == {"mutated": "yes"}
    [review] = hooks.calls("/label")
    assert review["_apiVersion"] == "admission.k8s.io/v1" and review["_query"] == "timeout=10s"
    assert review["kind"] == review["requestKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert review["resource"] == review["requestResource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert "subResource" not in review and review["name"] == "p" and review["namespace"] == "default"
    assert review["operation"] == "CREATE" and review["dryRun"] is False
    assert review["userInfo"]["username"] == "standin-admin" and review["oldObject"] is None
    assert review["object"]["metadata"]["name"] == "p" and "uid" not in review["object"]["metadata"]
    assert review["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    assert len(review["uid"]) == 36
    # the configuration is stored with admissionregistration/v1's defaults
    config = k8s.CustomObjectsApi(_api(cluster)).get_cluster_custom_object(
        "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "labeller")
    hook = config["webhooks"][0]
    assert (hook["failurePolicy"], hook["timeoutSeconds"], hook["reinvocationPolicy"], hook["matchPolicy"],
            hook["clientConfig"]["service"]["port"], hook["rules"][0]["scope"]) == ("Fail", 10, "Never", "Equivalent",
                                                                                   443, "*")


def test_kubectl_prints_the_warnings_and_a_denial(cluster, hooks, pki, tmp_path):
    hooks.answers["/warn"] = patching({"op": "add", "path": "/metadata/labels/seen", "value": "1"},
                                      warnings=('image "busybox" has no tag',))
    hooks.answers["/deny"] = lambda r: ({"allowed": r["object"]["metadata"]["name"] != "no",
                                         "status": {"code": 403, "reason": "Forbidden", "message": "not this one"}})
    _install(cluster, "a", _webhook("warn.example.com", "/warn", pki["ca"]),
             _webhook("deny.example.com", "/deny", pki["ca"]))
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(_pod("yes")))
    made = _kubectl(cluster.kubeconfig, "apply", "--validate=false", "-f", str(manifest))
    assert made.returncode == 0, made.stderr
    assert "pod/yes created" in made.stdout
    assert 'Warning: image "busybox" has no tag' in made.stderr, made.stderr
    manifest.write_text(json.dumps(_pod("no")))
    refused = _kubectl(cluster.kubeconfig, "apply", "--validate=false", "-f", str(manifest))
    assert refused.returncode != 0
    assert ('Error from server (Forbidden): error when creating "' in refused.stderr
            and 'admission webhook "deny.example.com" denied the request: not this one' in refused.stderr), \
        refused.stderr


def test_the_denial_keeps_the_webhooks_status_with_a_code_of_at_least_400(cluster, hooks, pki):
    hooks.answers["/deny"] = lambda r: {"allowed": False, "status": {"code": int(r["object"]["metadata"]["name"][1:]),
                                                                     "message": "no pods today"}}
    hooks.answers["/bare"] = lambda r: {"allowed": False}
    unlabelled = {"matchExpressions": [{"key": "bare", "operator": "DoesNotExist"}]}
    _install(cluster, "deny", _webhook("deny.example.com", "/deny", pki["ca"], objectSelector=unlabelled),
             _webhook("bare.example.com", "/bare", pki["ca"]))
    code, status = _refusal(cluster, _pod("c422"))
    assert code == 422 and status["code"] == 422 and status["status"] == "Failure"
    assert status["message"] == 'admission webhook "deny.example.com" denied the request: no pods today'
    code, status = _refusal(cluster, _pod("c200"))  # a code below 400 becomes 400 (kubernetes#77022)
    assert code == 400 and status["message"].endswith("no pods today")
    code, status = _refusal(cluster, _pod("x", {"bare": "1"}))
    assert code == 400 and status["message"] == 'admission webhook "bare.example.com" denied the request without ' \
                                                'explanation'
    assert k8s.CoreV1Api(_api(cluster)).list_namespaced_pod("default").items == []


def test_two_configurations_run_in_name_order_and_an_if_needed_webhook_is_called_again(cluster, hooks, pki):
    def first(request: dict[str, Any]) -> dict[str, Any]:
        labels = request["object"]["metadata"].get("labels") or {}
        return allow(request) if "first" in labels else patching(
            {"op": "add", "path": "/metadata/labels/first", "value": "1"})(request)

    hooks.answers["/first"] = first
    hooks.answers["/never"] = allow
    hooks.answers["/second"] = patching({"op": "add", "path": "/metadata/labels/second", "value": "1"})
    # created out of order: the configurations are called in order of name ("a-..." before "b-...")
    _install(cluster, "b-config", _webhook("second.example.com", "/second", pki["ca"]))
    _install(cluster, "a-config", _webhook("first.example.com", "/first", pki["ca"], reinvocationPolicy="IfNeeded"),
             _webhook("never.example.com", "/never", pki["ca"]))
    created = _create(cluster, _pod("p"))
    assert created["metadata"]["labels"] == {"first": "1", "second": "1"}
    with hooks.lock:
        order = [(path, sorted(req["object"]["metadata"].get("labels") or {})) for path, req in hooks.seen]
    # /second changed the object after /first ran: /first (IfNeeded) is called once more and sees both labels;
    # /never (reinvocationPolicy Never) is not
    assert order == [("/first", []), ("/never", ["first"]), ("/second", ["first"]), ("/first", ["first", "second"])]


@pytest.mark.parametrize("failure", ["Fail", "Ignore"])
def test_the_failure_policy_on_a_dead_endpoint_and_a_timeout(cluster, hooks, pki, failure):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]  # closed again: nothing listens there
    cluster.service_resolver[(NS, "dead", 443)] = ("127.0.0.1", dead_port)

    def slow(request: dict[str, Any]) -> dict[str, Any]:
        time.sleep(2.5)
        return allow(request)

    hooks.answers["/slow"] = slow
    dead = _webhook("dead.example.com", "/mutate", pki["ca"], failurePolicy=failure,
                    objectSelector={"matchLabels": {"to": "dead"}})
    dead["clientConfig"]["service"]["name"] = "dead"
    _install(cluster, "policy", dead, _webhook("slow.example.com", "/slow", pki["ca"], failurePolicy=failure,
                                               timeoutSeconds=1, objectSelector={"matchLabels": {"to": "slow"}}))
    if failure == "Ignore":
        assert _create(cluster, _pod("d", {"to": "dead"}))["metadata"]["name"] == "d"
        assert _create(cluster, _pod("s", {"to": "slow"}))["metadata"]["name"] == "s"
        return
    code, status = _refusal(cluster, _pod("d", {"to": "dead"}))
    assert code == 500 and status["reason"] == "InternalError"
    assert status["message"] == (
        'Internal error occurred: failed calling webhook "dead.example.com": failed to call webhook: Post '
        f'"https://dead.webhooks.svc:443/mutate?timeout=10s": dial tcp 127.0.0.1:{dead_port}: connect: '
        "connection refused")
    code, status = _refusal(cluster, _pod("s", {"to": "slow"}))
    assert code == 500 and status["message"] == (
        'Internal error occurred: failed calling webhook "slow.example.com": failed to call webhook: Post '
        '"https://hook.webhooks.svc:443/slow?timeout=1s": context deadline exceeded')


def test_tls_is_verified_against_the_ca_bundle_and_the_server_name(cluster, hooks, pki):
    hooks.answers["/m"] = patching({"op": "add", "path": "/metadata/labels/by", "value": "url"})
    stranger = _webhook("stranger.example.com", "/m", pki["stranger"], objectSelector={"matchLabels": {"t": "ca"}})
    by_url = {"url": f"https://localhost:{hooks.port}/m", "caBundle": pki["ca"]}
    # the same server behind another Service: the server name checked is other.webhooks.svc, not in the certificate
    cluster.service_resolver[(NS, "other", 443)] = ("127.0.0.1", hooks.port)
    wrong_host = {"service": {"namespace": NS, "name": "other", "path": "/m"}, "caBundle": pki["ca"]}
    _install(cluster, "tls", stranger,
             {**_webhook("url.example.com", "/m", pki["ca"], objectSelector={"matchLabels": {"t": "url"}}),
              "clientConfig": by_url},
             {**_webhook("host.example.com", "/m", pki["ca"], objectSelector={"matchLabels": {"t": "host"}}),
              "clientConfig": wrong_host})
    code, status = _refusal(cluster, _pod("a", {"t": "ca"}))
    assert code == 500 and status["message"].endswith(
        "x509: certificate signed by unknown authority"), status["message"]
    assert hooks.calls("/m") == []  # the handshake failed: no review reached the server
    assert _create(cluster, _pod("b", {"t": "url"}))["metadata"]["labels"]["by"] == "url"
    code, status = _refusal(cluster, _pod("c", {"t": "host"}))
    assert code == 500 and status["message"].startswith(
        'Internal error occurred: failed calling webhook "host.example.com": failed to call webhook: Post '
        '"https://other.webhooks.svc:443/m?timeout=10s": tls: failed to verify certificate: x509: certificate is valid '
        "for localhost, hook.webhooks.svc, not other.webhooks.svc"), status["message"]
    assert len(hooks.calls("/m")) == 1  # only the call that was verified


def test_selectors_conditions_and_rules_that_do_not_match_skip_the_call(cluster, hooks, pki):
    hooks.answers["/deny"] = lambda r: {"allowed": False, "status": {"message": "called"}}
    deny = pki["ca"]
    _install(cluster, "skips",
             _webhook("ns.example.com", "/deny", deny, namespaceSelector={
                 "matchLabels": {"kubernetes.io/metadata.name": "elsewhere"}}),
             _webhook("object.example.com", "/deny", deny, objectSelector={"matchLabels": {"team": "x"}}),
             _webhook("condition.example.com", "/deny", deny, matchConditions=[
                 {"name": "not-p", "expression": "object.metadata.name != 'p'"}]),
             _webhook("update.example.com", "/deny", deny, rules=[
                 {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]),
             _webhook("status.example.com", "/deny", deny, rules=[
                 {"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/status"]}]),
             _webhook("leases.example.com", "/deny", deny, rules=[
                 {"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["leases"]}]))
    assert _create(cluster, _pod("p"))["metadata"]["name"] == "p"
    assert hooks.calls("/deny") == []
    # each of them does call when it matches
    code, status = _refusal(cluster, _pod("p2"))  # matchConditions true
    assert code == 400 and status["message"] == 'admission webhook "condition.example.com" denied the request: called'
    core = k8s.CoreV1Api(_api(cluster))
    with pytest.raises(ApiException, match=r"update\.example\.com"):
        core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "b"}}})
    with pytest.raises(ApiException, match=r"status\.example\.com"):
        core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    with pytest.raises(ApiException) as caught:
        _create(cluster, _pod("p3", {"team": "x"}), ns="elsewhere")
    assert "ns.example.com" in caught.value.body  # first in order: the namespace's own name label matches
    assert len(hooks.calls("/deny")) == 4


def test_a_match_condition_that_fails_to_evaluate_follows_the_failure_policy(cluster, hooks, pki):
    hooks.answers["/ok"] = allow
    broken = [{"name": "broken", "expression": "object.metadata.annotations['missing'] == 'x'"}]
    _install(cluster, "conditions", _webhook("fail.example.com", "/ok", pki["ca"], matchConditions=broken,
                                             objectSelector={"matchLabels": {"p": "fail"}}),
             _webhook("ignore.example.com", "/ok", pki["ca"], matchConditions=broken, failurePolicy="Ignore"))
    code, status = _refusal(cluster, _pod("a", {"p": "fail"}))
    assert code == 403 and status["reason"] == "Forbidden"
    assert status["message"].startswith('pods "a" is forbidden: expression \'object.metadata.annotations[\'missing\'] '
                                        "== 'x'' resulted in error"), status["message"]
    assert _create(cluster, _pod("b"))["metadata"]["name"] == "b"
    assert hooks.calls("/ok") == []


def test_requests_are_defaulted_again_after_a_patch_adds_limits(cluster, hooks, pki):
    hooks.answers["/limits"] = patching({"op": "add", "path": "/spec/containers/0/resources/limits",
                                         "value": {"cpu": "500m", "memory": "64Mi"}})
    hooks.answers["/look"] = allow
    _install(cluster, "a-limits", _webhook("limits.example.com", "/limits", pki["ca"]))
    _install(cluster, "b-look", _webhook("look.example.com", "/look", pki["ca"]))
    created = _create(cluster, _pod("p", resources={"requests": {"memory": "32Mi"}}))
    assert created["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "500m", "memory": "64Mi"},
                                                             "requests": {"cpu": "500m", "memory": "32Mi"}}
    # defaulted right after the patch: the next webhook already sees the request
    [seen] = hooks.calls("/look")
    assert seen["object"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "32Mi"}


def test_mutation_comes_before_validating_admission_policy(cluster, hooks, pki):
    objects = k8s.CustomObjectsApi(_api(cluster))
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": "must-be-mutated"},
              "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE"], "resources": ["pods"]}]},
                       "validations": [{"expression": "has(object.metadata.labels) && "
                                                      "object.metadata.labels.exists(k, k == 'mutated')",
                                        "message": "not mutated"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "must-be-mutated"},
               "spec": {"policyName": "must-be-mutated", "validationActions": ["Deny"]}}
    for doc in (policy, binding):
        objects.create_cluster_custom_object("admissionregistration.k8s.io", "v1", POLICY_PLURALS[doc["kind"]], doc)
    code, status = _refusal(cluster, _pod("before"))  # no webhook yet: the policy refuses the plain pod
    assert code == 422 and "denied request: not mutated" in status["message"]
    hooks.answers["/label"] = patching({"op": "add", "path": "/metadata/labels/mutated", "value": "yes"})
    _install(cluster, "labeller", _webhook("label.example.com", "/label", pki["ca"]))
    assert _create(cluster, _pod("after"))["metadata"]["labels"] == {"mutated": "yes"}


def test_update_delete_and_binding_reviews(cluster, hooks, pki):
    hooks.answers["/all"] = allow
    hooks.answers["/patch-delete"] = patching({"op": "add", "path": "/metadata/labels/x", "value": "1"})
    everything = [{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "pods/*"]}]
    _install(cluster, "all", _webhook("all.example.com", "/all", pki["ca"], rules=everything),
             _webhook("pd.example.com", "/patch-delete", pki["ca"], objectSelector={"matchLabels": {"pd": "1"}},
                      rules=[{"operations": ["DELETE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"]}]))
    core = k8s.CoreV1Api(_api(cluster))
    _create(cluster, _pod("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "b"}}})
    core.create_namespaced_pod_binding("p", "default", {"apiVersion": "v1", "kind": "Binding",
                                                        "metadata": {"name": "p"}, "target": {"name": "node-1"}},
                                       _preload_content=False)
    core.delete_namespaced_pod("p", "default")
    _, update, bind, delete = hooks.calls("/all")
    assert update["operation"] == "UPDATE" and update["oldObject"]["metadata"].get("annotations") in (None, {})
    assert update["object"]["metadata"]["annotations"] == {"a": "b"}
    assert update["options"]["kind"] == "UpdateOptions"
    assert (bind["operation"], bind["subResource"], bind["requestSubResource"], bind["kind"]["kind"],
            bind["object"]["target"]) == ("CREATE", "binding", "binding", "Binding", {"name": "node-1"})
    assert delete["operation"] == "DELETE" and delete["object"] is None
    assert delete["oldObject"]["spec"]["nodeName"] == "node-1" and delete["options"]["kind"] == "DeleteOptions"
    _create(cluster, _pod("q", {"pd": "1"}))
    code, status = 0, {}
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("q", "default")
    code, status = caught.value.status, json.loads(caught.value.body)
    assert code == 500 and status["message"] == ('Internal error occurred: admission webhook "pd.example.com" '
                                                 "attempted to modify the object, which is not supported for this "
                                                 "operation")


def test_dry_run_reaches_only_webhooks_without_side_effects_and_stores_nothing(cluster, hooks, pki):
    hooks.answers["/ok"] = patching({"op": "add", "path": "/metadata/labels/m", "value": "1"})
    _install(cluster, "dry", _webhook("clean.example.com", "/ok", pki["ca"], sideEffects="NoneOnDryRun"),
             _webhook("dirty.example.com", "/ok", pki["ca"], sideEffects="Some",
                      objectSelector={"matchLabels": {"dirty": "1"}}))
    answered = _create(cluster, _pod("p"), dry_run="All")
    assert answered["metadata"]["labels"] == {"m": "1"} and "resourceVersion" not in answered["metadata"]
    assert hooks.calls("/ok")[0]["dryRun"] is True
    assert hooks.calls("/ok")[0]["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1",
                                                "dryRun": ["All"]}
    code, status = _refusal(cluster, _pod("q", {"dirty": "1"}), dry_run="All")
    assert code == 400 and status["message"] == 'admission webhook "dirty.example.com" does not support dry run'
    assert k8s.CoreV1Api(_api(cluster)).list_namespaced_pod("default").items == []


def test_webhooks_are_called_without_the_api_servers_lock(cluster, hooks, pki):
    """A webhook that reads from the API server while it answers (as many do) is served: no lock is held during
    the call (were it held, the webhook's own request would wait for it and the call would time out)."""
    core = k8s.CoreV1Api(_api(cluster))

    def reads_back(request: dict[str, Any]) -> dict[str, Any]:
        names = [p.metadata.name for p in core.list_namespaced_pod("default").items]
        return patching({"op": "add", "path": "/metadata/annotations",
                         "value": {"pods-seen": ",".join(names) or "-"}})(request)

    hooks.answers["/reads"] = reads_back
    _install(cluster, "reader", _webhook("reader.example.com", "/reads", pki["ca"], timeoutSeconds=5))
    assert _create(cluster, _pod("a"))["metadata"]["annotations"] == {"pods-seen": "-"}
    assert _create(cluster, _pod("b"))["metadata"]["annotations"] == {"pods-seen": "a"}


def test_a_webhook_that_does_not_speak_v1_or_answers_for_another_request_fails_the_call(cluster, hooks, pki):
    hooks.answers["/other-uid"] = lambda r: {"uid": "not-" + r["uid"], "allowed": True}
    hooks.answers["/ok"] = allow
    _install(cluster, "bad", _webhook("versions.example.com", "/ok", pki["ca"], admissionReviewVersions=["v2"],
                                      objectSelector={"matchLabels": {"t": "v"}}),
             _webhook("uid.example.com", "/other-uid", pki["ca"], objectSelector={"matchLabels": {"t": "u"}}))
    code, status = _refusal(cluster, _pod("a", {"t": "v"}))
    assert code == 500 and status["message"] == (
        'Internal error occurred: failed calling webhook "versions.example.com": could not create admission objects: '
        "webhook does not accept known AdmissionReview versions (v1, v1beta1)")
    code, status = _refusal(cluster, _pod("b", {"t": "u"}))
    assert code == 500 and ('failed calling webhook "uid.example.com": received invalid webhook response: expected '
                            'response.uid=') in status["message"]


def test_an_update_racing_a_slow_webhook_is_started_again_on_the_new_object(cluster, hooks, pki):
    """GuaranteedUpdate: the object changed while the webhook was called, so the update is applied again to the
    new object (and the webhook called again) instead of overwriting the change."""
    core = k8s.CoreV1Api(_api(cluster))
    _create(cluster, _pod("p"))
    started = threading.Event()

    def slow(request: dict[str, Any]) -> dict[str, Any]:
        if (request["object"]["metadata"].get("annotations") or {}).get("slow") and not started.is_set():
            started.set()
            time.sleep(0.5)
        return allow(request)

    hooks.answers["/slow"] = slow
    _install(cluster, "slow", _webhook("slow.example.com", "/slow", pki["ca"], rules=[
        {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]))
    racer = threading.Thread(target=core.patch_namespaced_pod, args=("p", "default",
                                                                     {"metadata": {"annotations": {"slow": "1"}}}))
    racer.start()
    assert started.wait(5)
    # meanwhile another change lands (its own call is quick)
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"racing": "yes"}}})
    racer.join(10)
    pod = core.read_namespaced_pod("p", "default")
    assert pod.metadata.annotations == {"slow": "1"} and pod.metadata.labels == {"racing": "yes"}
    slow_calls = [r for r in hooks.calls("/slow") if (r["object"]["metadata"].get("annotations") or {}).get("slow")]
    assert len(slow_calls) == 2 and (slow_calls[1]["oldObject"]["metadata"]["labels"] == {"racing": "yes"})
