"""Configuration of `vgpu scheduler`: a pydantic model read from a YAML file, then overridden by flags.

Called by vgpu.scheduler.cli. Keys are the snake_case field names below; unknown keys are an error naming the key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vgpu.configfile import read_yaml_mapping, validated
from vgpu.resources import SCHEDULER_NAME, SharingConfig
from vgpu.scheduler.policies import DEFAULT_NODE_POLICY

__all__ = ["SchedulerConfig", "load_config"]


class SchedulerConfig(BaseModel):
    """Everything `vgpu scheduler` can be told."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str | None = Field(None, description="kubeconfig path; none = in-cluster or ~/.kube/config")
    listen: str = Field(":8888", description="extender HTTP address HOST:PORT")
    metrics_listen: str = Field(":9395", description="Prometheus metrics address HOST:PORT ('' = off)")
    scheduler_name: str = Field(SCHEDULER_NAME, description="component name on events and the lease name")
    node_policy: str = Field(DEFAULT_NODE_POLICY, description="node policy registered in vgpu.scheduler.policies")
    gpu_policy: Literal["binpack", "spread"] = Field("binpack", description="GPU order inside a node")
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
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="largest request body accepted")
    leader_elect: bool = Field(False, description="run Lease leader election (several replicas)")
    lease_name: str = Field(SCHEDULER_NAME, description="Lease name for leader election")
    lease_namespace: str = Field("kube-system", description="Lease namespace for leader election")
    pod_field_selector: str = Field(
        "status.phase!=Succeeded,status.phase!=Failed", description="field selector of the pod watch"
    )


def load_config(path: str | None, overrides: dict[str, Any]) -> SchedulerConfig:
    """Read `path` (YAML mapping; None = defaults) and apply the non-None `overrides` (from flags)."""
    data: dict[str, Any] = read_yaml_mapping(path, "--config") if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return validated(SchedulerConfig, data, path or "flags")
