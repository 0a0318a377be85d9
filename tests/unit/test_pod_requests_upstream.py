"""What a pod takes from its node, against kubernetes/component-helpers' own test table (resource/helpers_test.go,
`TestPodRequestsAndLimits` cases with restartable init containers, commit 1961876): the product's arithmetic
(`vgpu.requests.pod_resource_requests`, what the extender's ledger charges) and the test bed's own
(`vgpu.testbed.kubemath.pod_requests`, the kube-scheduler stand-in's) are each held to upstream's expected values,
not to each other."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from vgpu.requests import pod_resource_requests
from vgpu.testbed.kubemath import parse_quantity, pod_requests


def _c(name: str, cpu: str, sidecar: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "resources": {"requests": {"cpu": cpu}}}
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


CASES = [  # (upstream description, init containers, containers, expected CPU in cores)
    ("restartable init container", [_c("restartable-init-1", "1", True)], [_c("container-1", "1")], 2),
    ("multiple restartable init containers",
     [_c("init-1", "5"), _c("restartable-init-1", "1", True), _c("restartable-init-2", "2", True),
      _c("restartable-init-3", "3", True)], [_c("container-1", "1")], 7),
    ("multiple restartable and regular init containers",
     [_c("init-1", "5"), _c("restartable-init-1", "1", True), _c("restartable-init-2", "2", True),
      _c("init-2", "5"), _c("restartable-init-3", "3", True)], [_c("container-1", "1")], 8),
    ("restartable-init, init and regular",
     [_c("restartable-init-1", "10", True), _c("init-1", "200")], [_c("container-1", "100")], 210),
    ("nil options, larger init container", [_c("init-1", "4")], [_c("container-1", "1"), _c("container-2", "2")], 4),
]


@pytest.mark.parametrize("arithmetic", [pod_resource_requests, pod_requests], ids=["product", "stand-in"])
@pytest.mark.parametrize("description,init,containers,cores", CASES, ids=[c[0] for c in CASES])
def test_cpu_as_upstream_computes_it(arithmetic, description, init, containers, cores):
    pod = {"spec": {"initContainers": init, "containers": containers}}
    assert arithmetic(pod)["cpu"] == cores * 1000


@pytest.mark.parametrize("arithmetic", [pod_resource_requests, pod_requests], ids=["product", "stand-in"])
def test_pod_level_requests_replace_cpu_and_memory_and_the_overhead_is_added(arithmetic):
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "1", "memory": "1Gi", "example.com/x": "3"}}}],
                    "resources": {"requests": {"cpu": "4", "memory": "2Gi"}},
                    "overhead": {"cpu": "250m", "memory": "64Mi"}}}
    got = arithmetic(pod)
    assert (got["cpu"], got["memory"], got["example.com/x"]) == (4250, 2 * 2**30 + 64 * 2**20, 3)


@pytest.mark.parametrize("text,value", [
    ("100m", Fraction(1, 10)), ("1Gi", Fraction(2**30)), ("1.5", Fraction(3, 2)), ("2e3", Fraction(2000)),
    ("5E-1", Fraction(1, 2)), ("129M", Fraction(129 * 10**6)), (".5Ki", Fraction(512)), ("-1", Fraction(-1)),
])
def test_the_stand_in_reads_quantities_as_apimachinery(text, value):
    # apimachinery pkg/api/resource/quantity.go ParseQuantity: signed number, then binary or decimal SI, or an
    # exponent
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1 Gi", "Gi", "1GB", "1.2.3", "0x10", "1ki"])
def test_the_stand_in_refuses_what_apimachinery_refuses(text):
    with pytest.raises(ValueError):
        parse_quantity(text)
