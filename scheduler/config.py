"""Configuration of `vgpu scheduler`: a pydantic model read from a YAML file, then overridden by flags.

Called by vgpu.scheduler.cli. Keys are the snake_case field names below; unknown keys are an error naming the key.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vgpu.configfile import read_yaml_mapping, validated
from vgpu.errors import ConfigError
from vgpu.resources import SCHEDULER_NAME, SharingConfig
from vgpu.scheduler.policies import DEFAULT_NODE_POLICY
from vgpu.units import KIB, MIB

__all__ = ["SchedulerConfig", "load_config"]


class SchedulerConfig(BaseModel):
    """Everything `vgpu scheduler` can be told."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str | None = Field(None, description="kubeconfig path; none = in-cluster or ~/.kube/config")
    listen: str = Field(
        "127.0.0.1:8888", description="extender address HOST:PORT; loopback by default (kube-scheduler runs beside "
        "it); any other address needs the TLS files"
    )
    tls_cert_file: str | None = Field(None, description="serve HTTPS with this certificate (PEM)")
    tls_key_file: str | None = Field(None, description="the certificate's private key (PEM)")
    tls_client_ca_file: str | None = Field(
        None, description="require client certificates signed by this CA (PEM): only kube-scheduler may call"
    )
    metrics_listen: str = Field(":9395", description="Prometheus metrics address HOST:PORT ('' = off)")
    scheduler_name: str = Field(SCHEDULER_NAME, description="component name on events and the lease name")
    scheduler_names: list[str] = Field(
        default_factory=lambda: [SCHEDULER_NAME], min_length=1,
        description="spec.schedulerName values of the pods this extender places and charges (add the names of other "
        "schedulers that place vGPU pods on the same nodes)",
    )
    grant_key_file: str | None = Field(
        None, description="sign each assignment with the key in this file (the Secret the device plugins check with)"
    )
    node_policy: str = Field(DEFAULT_NODE_POLICY, description="node policy registered in vgpu.scheduler.policies")
    gpu_policy: Literal["binpack", "spread"] = Field("binpack", description="GPU order inside a node")
    topology: bool = Field(
        True, description="topology-aware placement: a multi-GPU container gets GPUs of one NVLink island, else of "
        "one NUMA node, and nodes that can give that are preferred (docs/placement.md; no effect where the nodes do "
        "not publish islands)"
    )
    mode: Literal["decide", "score"] = Field(
        "decide", description="decide: /filter returns the best node; score: all feasible + /prioritize"
    )
    sharing: SharingConfig = Field(default_factory=SharingConfig, description="resource names and defaults")
    qps: float = Field(50.0, gt=0, description="API client requests per second")
    burst: int = Field(100, ge=1, description="API client burst")
    assume_ttl_seconds: float = Field(
        30.0, gt=0, description="how long a /filter reservation waits for /bind before it is dropped"
    )
    bound_ttl_seconds: float = Field(
        600.0, gt=0, description="how long a bound pod's charge waits for the pod watch to confirm it"
    )
    max_body_bytes: int = Field(
        4 * MIB, ge=KIB,
        description="largest request body accepted (nodeCacheCapable requests with 5,000 names are about 200 KB)",
    )
    leader_elect: bool = Field(False, description="run Lease leader election (several replicas)")
    lease_name: str = Field(SCHEDULER_NAME, description="Lease name for leader election")
    lease_namespace: str = Field("kube-system", description="Lease namespace for leader election")
    follow_lease: str = Field(
        "", description="NAMESPACE/NAME of the Lease kube-scheduler campaigns for (its leaderElection "
        "resourceNamespace/resourceName): lead while the kube-scheduler of this pod holds it, instead of holding a "
        "Lease of our own (several replicas; excludes leader_elect)"
    )
    unready_restart_seconds: float = Field(
        180.0, gt=0, description="a replica that should serve (it leads, or runs alone) but has not been ready for "
        "this long fails its liveness probe (/healthz), so that kubelet restarts it"
    )
    leader_identity: str = Field(
        "", description="with follow_lease: the hostname kube-scheduler's identity starts with (`<hostname>_<uuid>`); "
        "default this host's name, which the containers of one pod share"
    )
    dra: bool = Field(
        False, description="DRA mode: watch ResourceSlices and ResourceClaims of the gpu.vgpu-sharing.io driver and "
        "filter and score the pods that ask its DeviceClass through claims (docs/dra.md; needs list and watch on "
        "resourceslices and resourceclaims)"
    )
    pod_field_selector: str = Field(
        "status.phase!=Succeeded,status.phase!=Failed", description="field selector of the pod watch"
    )
    preemption: bool = Field(
        True, description="a pod with a priority that fits no node evicts the fewest pods of lower priority holding "
        "GPU shares, through the Eviction API (docs/preemption.md; needs create on pods/eviction)"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost, or "" (every interface)


def check_listen(config: SchedulerConfig) -> None:
    """Refuse a non-loopback address without TLS, and TLS files given half; raises ConfigError.

    `listen` is read as the server reads it ('HOST:PORT', '[V6]:PORT', ':PORT' or 'HOST'); loopback is localhost,
    127.0.0.0/8 and ::1. Whether the TLS files load is checked when the server is built
    (vgpu.httpserve.make_uvicorn_server).
    """
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise ConfigError("--tls-cert-file and --tls-key-file: give both or neither")
    if config.tls_client_ca_file and not config.tls_cert_file:
        raise ConfigError("--tls-client-ca-file: needs --tls-cert-file and --tls-key-file")
    host, sep, _ = config.listen.rpartition(":")  # as vgpu.httpserve.parse_listen splits it
    host = (host if sep else config.listen).strip("[]")
    if not _is_loopback(host) and not config.tls_client_ca_file:
        raise ConfigError(f"--listen {config.listen}: an address other than loopback needs --tls-cert-file, "
                          "--tls-key-file and --tls-client-ca-file (mutual TLS), or the extender answers anyone")


def check_leadership(config: SchedulerConfig) -> None:
    """Refuse both kinds of leadership at once and a malformed `follow_lease`; raises ConfigError."""
    if not config.follow_lease:
        if config.leader_identity:
            raise ConfigError("--leader-identity: needs --follow-lease")
        return
    if config.leader_elect:
        raise ConfigError("--follow-lease and --leader-elect: give one (follow kube-scheduler's Lease, or hold one)")
    namespace, sep, name = config.follow_lease.partition("/")
    if not (sep and namespace and name) or "/" in name:
        raise ConfigError(f"--follow-lease {config.follow_lease}: expected NAMESPACE/NAME of kube-scheduler's Lease")


def load_config(path: str | None, overrides: dict[str, Any]) -> SchedulerConfig:
    """Read `path` (YAML mapping; None = defaults) and apply the non-None `overrides` (from flags)."""
    data: dict[str, Any] = read_yaml_mapping(path, "--config") if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    config = validated(SchedulerConfig, data, path or "flags")
    check_listen(config)
    check_leadership(config)
    return config
