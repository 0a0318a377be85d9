"""`vgpu webhook` as a process: AdmissionReview over HTTPS verified against its CA, refusals, garbage and oversized
bodies (never a 500), and the flags' errors in one line before anything is served."""

import base64
import os
import socket
import ssl
import subprocess
import sys
import time

import httpx
import jsonpatch
import orjson
import pytest

from vgpu.testbed.cluster import free_port
from vgpu.testbed.pki import make_pki
from vgpu.webhook.server import BODY_SECONDS, MAX_BODY, MAX_CONTAINERS

VGPU = [sys.executable, "-m", "vgpu.cli"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def webhook(pki, tmp_path_factory):
    config = tmp_path_factory.mktemp("config") / "scheduler.yaml"
    config.write_text("sharing:\n  quota_card_mib: 16384\nnode_policy: binpack\n")  # other sections are the scheduler's
    port = free_port()
    proc = subprocess.Popen([*VGPU, "webhook", "--listen", f"127.0.0.1:{port}", "--tls-cert-file", str(pki["cert"]),
                             "--tls-private-key-file", str(pki["key"]), "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    client = httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=ssl.create_default_context(cafile=pki["ca"]),
                          timeout=5)
    deadline = time.monotonic() + 20
    while True:
        try:
            if client.get("/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "webhook did not come up"
        time.sleep(0.1)
    yield client
    client.close()
    proc.terminate()
    proc.wait(10)


def review(obj, operation="CREATE", resource="pods", uid="705ab4f5-6393-11e8-b7cc-42010a800002"):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": resource},
                        "namespace": "team", "operation": operation, "object": obj,
                        "userInfo": {"username": "alice"}, "dryRun": False}}


def hami_pod():
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "infer-", "namespace": "team"},
            "spec": {"schedulerName": "default-scheduler", "containers": [{
                "name": "infer", "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}}}]}}


def test_a_hami_pod_is_answered_with_a_patch_that_opts_it_in(webhook):
    answer = webhook.post("/mutate-pods", content=orjson.dumps(review(hami_pod())))
    assert answer.status_code == 200
    body = answer.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    out = jsonpatch.apply_patch(hami_pod(), orjson.loads(base64.b64decode(response["patch"])))
    assert out["spec"]["schedulerName"] == "vgpu-scheduler"
    assert out["spec"]["containers"][0]["resources"]["limits"] == {
        "volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory-percentage": 50,
        "volcano.sh/vgpu-memory-total": "8192", "volcano.sh/vgpu-cores-total": "0"}  # 50 % of --config's 16384


def test_other_requests_are_allowed_unchanged(webhook):
    plain = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}
    for body in (review(plain), review(hami_pod(), operation="UPDATE"), review(hami_pod(), resource="deployments")):
        response = webhook.post("/mutate-pods", content=orjson.dumps(body)).json()["response"]
        assert response["allowed"] is True and "patch" not in response


def test_a_pod_whose_requests_cannot_be_read_is_refused_with_the_reason(webhook):
    bad = hami_pod()
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "half"
    response = webhook.post("/mutate-pods", content=orjson.dumps(review(bad))).json()["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"].startswith("container 'infer': volcano.sh/vgpu-memory-percentage: ")


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}}),
     "expected apiVersion admission.k8s.io/v1"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "has no request"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}),
     "has no uid"),
])
def test_garbage_gets_400_with_a_reason(webhook, body, fragment):
    answer = webhook.post("/mutate-pods", content=body)
    assert answer.status_code == 400
    assert fragment in answer.json()["error"]


def test_an_oversized_body_gets_413_and_the_server_goes_on(webhook):
    answer = webhook.post("/mutate-pods", content=b" " * (MAX_BODY + 1))
    assert answer.status_code == 413
    assert webhook.post("/mutate-pods", content=orjson.dumps(review(hami_pod()))).status_code == 200


def test_a_pod_of_too_many_containers_is_refused_before_any_is_read(webhook):
    """A review of 20,000 containers (what a client posting to the Service directly sends to hold the webhook up)
    is refused with the count; a pod at the cap is reviewed."""
    crowd = hami_pod()
    crowd["spec"]["containers"] = [{"name": f"c{i}", "image": "cuda", "resources": {"limits": {
        "nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}}} for i in range(20_000)]
    answer = webhook.post("/mutate-pods", content=orjson.dumps(review(crowd)))
    assert answer.status_code == 200
    response = answer.json()["response"]
    assert response["allowed"] is False and response["status"]["message"] == (
        f"the pod has 20000 containers, over the {MAX_CONTAINERS} the vGPU webhook reviews")
    crowd["spec"]["containers"] = crowd["spec"]["containers"][:MAX_CONTAINERS]
    answer = webhook.post("/mutate-pods", content=orjson.dumps(review(crowd)))
    assert answer.json()["response"]["allowed"] is True and answer.json()["response"]["patch"]


def test_a_body_that_does_not_arrive_gets_408_while_others_are_answered(webhook, pki):
    """A client that sends its headers and part of the body, then nothing, is answered 408 after BODY_SECONDS;
    meanwhile other reviews are answered."""
    port = int(str(webhook.base_url).rsplit(":", 1)[1].rstrip("/"))
    context = ssl.create_default_context(cafile=pki["ca"])
    with socket.create_connection(("127.0.0.1", port), timeout=BODY_SECONDS + 10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as slow:
        slow.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"apiVersion\"")
        assert webhook.post("/mutate-pods", content=orjson.dumps(review(hami_pod()))).status_code == 200
        answer = slow.recv(4096)
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            more = slow.recv(4096)
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert f"not received within {BODY_SECONDS:g} s".encode() in answer


def test_plain_http_gets_no_answer(webhook):
    port = int(str(webhook.base_url).rsplit(":", 1)[1].rstrip("/"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        sock.settimeout(5)
        try:
            data = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            data = b""
    assert b"AdmissionReview" not in data and b"HTTP/1.1 200" not in data


@pytest.mark.parametrize("args, fragment", [
    (["--tls-cert-file", "/nonexistent/tls.crt", "--tls-private-key-file", "/nonexistent/tls.key"],
     "vgpu webhook: --tls-cert-file /nonexistent/tls.crt with --tls-private-key-file /nonexistent/tls.key: cannot be "
     "used"),
    (["--tls-cert-file", "CERT", "--tls-private-key-file", "KEY", "--config", "/nonexistent/s.yaml"],
     "vgpu webhook: --config /nonexistent/s.yaml: No such file"),
    (["--tls-cert-file", "CERT", "--tls-private-key-file", "KEY", "--listen", "127.0.0.1:99999"],
     "vgpu webhook: listen address '127.0.0.1:99999': port must be 0..65535"),
    (["--tls-cert-file", "CERT"], "the following arguments are required: --tls-private-key-file"),
])
def test_flag_errors_are_one_line(pki, tmp_path, args, fragment):
    args = [str(pki["cert"]) if a == "CERT" else str(pki["key"]) if a == "KEY" else a for a in args]
    done = subprocess.run([*VGPU, "webhook", *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr


def test_a_bad_sharing_section_is_one_line(pki, tmp_path):
    config = tmp_path / "scheduler.yaml"
    config.write_text("sharing:\n  hami_names: sometimes\n")
    done = subprocess.run([*VGPU, "webhook", "--tls-cert-file", str(pki["cert"]), "--tls-private-key-file",
                           str(pki["key"]), "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.startswith("vgpu webhook: hami_names: ") and len(done.stderr.strip().splitlines()) == 1
