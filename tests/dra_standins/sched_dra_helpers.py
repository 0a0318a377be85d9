"""Helpers (and the `cluster` fixture) of the DRA tests of the kube-scheduler stand-in: the API-server stand-in,
the driver without an extender, and helpers that speak HTTP (httpx) to the API server. The slices are written
here, not taken from our plugin."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from vgpu.testbed.apiserver import ApiServerStandIn
from vgpu.testbed.scheduler_driver import SchedulerDriver, parse_scheduler_config

DRIVER = "gpu.test.example"
SCHEDULER = "dra-scheduler"
CONFIG = f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: {SCHEDULER}
"""
RESOURCE = "/apis/resource.k8s.io/v1"


def device(name: str, model: str = "A100", memory: str = "40Gi", shared: bool = True,
           memory_policy: dict | None = None, cores_policy: dict | None = None) -> dict:
    """A device with `memory` and `cores` capacity, shared (allowMultipleAllocations) unless told otherwise."""
    body: dict[str, Any] = {
        "name": name,
        "attributes": {"model": {"string": model}, "index": {"int": int(name.rsplit("-", 1)[-1])}},
        "capacity": {
            "memory": {"value": memory, **({"requestPolicy": memory_policy} if memory_policy else {})},
            "cores": {"value": "100", "requestPolicy": cores_policy or {"default": "0",
                                                                        "validRange": {"min": "0", "step": "1"}}},
        },
    }
    if shared:
        body["allowMultipleAllocations"] = True
    return body


MEMORY_POLICY = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}


class Cluster:
    """The API-server stand-in and a driver, seen through HTTP."""

    def __init__(self, api: ApiServerStandIn, kubeconfig: str) -> None:
        self.api = api
        self.kubeconfig = kubeconfig
        self.http = httpx.Client(base_url=api.url, timeout=10)
        self.drivers: list[SchedulerDriver] = []

    def start_scheduler(self, flush: float = 30.0) -> SchedulerDriver:
        driver = SchedulerDriver(parse_scheduler_config(CONFIG), self.kubeconfig, seed=1,
                                 unschedulable_flush=flush).start()
        self.drivers.append(driver)
        return driver

    def post(self, path: str, body: dict) -> dict:
        resp = self.http.post(path, json=body)
        assert resp.status_code in (200, 201), resp.text
        return resp.json()

    def node(self, name: str, labels: dict | None = None, allocatable: dict | None = None) -> dict:
        alloc = {"cpu": "8", "memory": "32Gi", "pods": "110", **(allocatable or {})}
        return self.post("/api/v1/nodes", {"metadata": {"name": name, "labels": {"name": name, **(labels or {})}},
                                            "status": {"allocatable": alloc}})

    def slice(self, node: str, devices: list[dict], name: str = "", **spec: Any) -> dict:
        body = {"driver": DRIVER, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices, **spec}
        if not any(k in spec for k in ("allNodes", "nodeSelector", "perDeviceNodeSelection")):
            body["nodeName"] = node
        return self.post(f"{RESOURCE}/resourceslices", {"metadata": {"name": name or f"{node}-{DRIVER}"},
                                                        "spec": body})

    def device_class(self, name: str, selectors: list[str] | None = None, **spec: Any) -> dict:
        sel = [{"cel": {"expression": e}} for e in (selectors or [f'device.driver == "{DRIVER}"'])]
        return self.post(f"{RESOURCE}/deviceclasses", {"metadata": {"name": name},
                                                       "spec": {"selectors": sel, **spec}})

    def claim(self, name: str, requests: list[dict], constraints: list[dict] | None = None) -> dict:
        devices: dict[str, Any] = {"requests": requests}
        if constraints:
            devices["constraints"] = constraints
        return self.post(f"{RESOURCE}/namespaces/default/resourceclaims",
                         {"metadata": {"name": name}, "spec": {"devices": devices}})

    def template(self, name: str, requests: list[dict]) -> dict:
        return self.post(f"{RESOURCE}/namespaces/default/resourceclaimtemplates",
                         {"metadata": {"name": name},
                          "spec": {"metadata": {"labels": {"made-from": name}},
                                   "spec": {"devices": {"requests": requests}}}})

    def pod(self, name: str, claims: list[dict] | None = None, limits: dict | None = None,
            node_selector: dict | None = None) -> dict:
        container: dict[str, Any] = {"name": "main", "image": "busybox",
                                     "resources": {"requests": {"cpu": "100m"}, **({"limits": limits}
                                                                                    if limits else {})}}
        spec: dict[str, Any] = {"schedulerName": SCHEDULER, "containers": [container]}
        if claims:
            spec["resourceClaims"] = claims
            container["resources"]["claims"] = [{"name": c["name"]} for c in claims]
        if node_selector:
            spec["nodeSelector"] = node_selector
        return self.post("/api/v1/namespaces/default/pods", {"metadata": {"name": name}, "spec": spec})

    def get(self, path: str) -> dict | None:
        resp = self.http.get(path)
        if resp.status_code == 404:
            return None
        assert resp.status_code == 200, resp.text
        return resp.json()

    def get_pod(self, name: str) -> dict:
        pod = self.get(f"/api/v1/namespaces/default/pods/{name}")
        assert pod is not None
        return pod

    def get_claim(self, name: str) -> dict | None:
        return self.get(f"{RESOURCE}/namespaces/default/resourceclaims/{name}")

    def claims(self) -> list[dict]:
        listing = self.get(f"{RESOURCE}/namespaces/default/resourceclaims")
        assert listing is not None
        return listing["items"]

    def events(self, pod: str) -> list[dict]:
        listing = self.get("/api/v1/namespaces/default/events")
        assert listing is not None
        return [e for e in listing["items"] if e["involvedObject"]["name"] == pod]

    def bound(self, name: str, timeout: float = 20.0) -> dict:
        return wait(lambda: (p := self.get_pod(name))["spec"].get("nodeName") and p, timeout, f"{name} bound")

    def unschedulable(self, name: str, timeout: float = 20.0) -> str:
        """The PodScheduled=False message once the scheduler wrote one."""
        def message() -> str | None:
            pod = self.get_pod(name)
            assert not pod["spec"].get("nodeName"), f"{name} got bound to {pod['spec']['nodeName']}"
            return next((c.get("message") for c in pod["status"].get("conditions") or ()
                         if c["type"] == "PodScheduled" and c["status"] == "False"), None)
        return wait(message, timeout, f"{name} unschedulable")

    def close(self) -> None:
        for driver in self.drivers:
            driver.stop()
        self.http.close()


def wait(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll until `predicate` returns something true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def exactly(klass: str, name: str = "gpu", **fields: Any) -> dict:
    """A claim request `{name, exactly: {deviceClassName, ...}}`."""
    return {"name": name, "exactly": {"deviceClassName": klass, **fields}}


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[Cluster]:
    """The API-server stand-in (in-process) with the Cluster helpers; each test starts the driver itself."""
    api = ApiServerStandIn().start()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    env = Cluster(api, str(kubeconfig))
    yield env
    env.close()
    api.stop()
