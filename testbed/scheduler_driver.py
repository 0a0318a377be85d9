"""TEST INFRASTRUCTURE: a kube-scheduler stand-in that drives our extender the way kube-scheduler does.

Used by `vgpu demo` and tests/e2e; never shipped. It reads a KubeSchedulerConfiguration (the one in deploy/, either
the bare document or the ConfigMap that carries it), watches pods whose `spec.schedulerName` is a profile's
`schedulerName` and that have no `spec.nodeName`, and runs for each one the steps of kube-scheduler's
`schedule_one.go`:

  1. in-tree filters: node unschedulable, untolerated NoSchedule/NoExecute taints, nodeSelector, and resource fit
     (requests of cpu, memory, pods, ephemeral-storage and extended resources against node allocatable minus the
     pods already there and the pods assumed on it), skipping the extended resources NodeResourcesFit ignores:
     the profile's pluginConfig `NodeResourcesFit` args `ignoredResources` (names) and `ignoredResourceGroups`
     (the part of a name before `/`), except that when any extender lists `managedResources` with
     `ignoredByScheduler: true`, those names replace every profile's `ignoredResources` (buildExtenders in
     pkg/scheduler/scheduler.go; the check in pkg/scheduler/framework/plugins/noderesources/fit.go);
  2. extenders, sequentially, only if interested in the pod (HTTPExtender.IsInterested in
     pkg/scheduler/extender.go: it asks for one of their `managedResources`, in requests or limits of containers
     or init containers; all pods if the list is empty):
     `POST {urlPrefix}/{filterVerb}` with ExtenderArgs `{"Pod", "Nodes", "NodeNames"}` (NodeNames when
     `nodeCacheCapable`, else a NodeList), keeping the `NodeNames` (or `Nodes`) answered; `FailedNodes` and
     `FailedAndUnresolvableNodes` become the reasons;
  3. if more than one node is feasible: the in-tree score (NodeResourcesFit LeastAllocated on cpu and memory,
     0..100) plus, per extender with a `prioritizeVerb`, `Score x weight x 10` (MaxNodeScore / MaxExtenderPriority);
     a prioritize error only drops that extender's scores; the best node wins, ties broken at random;
  4. assume the pod on the node, then in a binding goroutine (a thread here) `POST {urlPrefix}/{bindVerb}` with
     ExtenderBindingArgs `{"PodName", "PodNamespace", "PodUID", "Node"}` when an interested extender binds, else
     the default binder (`pods/binding`).
  Nominated pods (pkg/scheduler/backend/queue/nominator.go, framework/runtime RunFilterPluginsWithNominatedPods):
     a pending pod of this scheduler with `status.nominatedNodeName` (or nominated in memory by the last PostFilter)
     counts on that node for the in-tree filters of every pod of lower or equal priority (addGENominatedPods: a
     first pass with them, a second without them when they were added; both must pass); a pod that has a
     nominated node tries that node alone first (evaluateNominatedNode: in-tree filters, then the extenders'
     filterVerb with just that node) and takes it when it passes; assuming a pod drops its nomination.
  PostFilter, when no node fits (schedulingCycle after a FitError; testbed/preemption.py has the plugin and its
     fidelity notes): unless the driver is told `preemption=False` (CLI `--no-preemption`), with DefaultPreemption
     enabled in the profile (not in `plugins.postFilter.disabled` / `plugins.multiPoint.disabled` by name or
     `'*'`, unless listed again under `enabled`; pluginConfig `DefaultPreemption` args minCandidateNodesPercentage /
     minCandidateNodesAbsolute, defaults 10 / 100), DefaultPreemption dry-runs the nodes whose status is
     Unschedulable with the in-tree filters only (NOT the extenders' filterVerb: a node only an extender rejected
     yields no victim and no candidate, `expected at least one victim pod on node "n"` -- see
     testbed/preemption.py, this is upstream's behaviour and is kept), then `POST {urlPrefix}/{preemptVerb}` with
     ExtenderPreemptionArgs `{"Pod", "NodeNameToVictims", "NodeNameToMetaVictims"}` (NodeNameToMetaVictims, pods
     as `{"UID"}`, when `nodeCacheCapable`, else NodeNameToVictims with whole pods; the other one null) to each
     interested extender with a preemptVerb, whose ExtenderPreemptionResult `{"NodeNameToMetaVictims"}` replaces
     the candidates (convertToVictims: an unknown node or a uid not on that node is an error; a node with no
     victims is an error unless the extender is ignorable, then it is dropped); the best candidate is nominated
     (`status.nominatedNodeName`, patched with the PodScheduled condition) and its victims are preempted in the
     background (async preemption, 1.34's default) while the preemptor is held out of the queue: DisruptionTarget
     condition, delete, `Preempted` event. The FailedScheduling message gains the PostFilter's message
     (" preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.", " preemption: not
     eligible due to preemptionPolicy=Never.", ...; nothing when a node was nominated). Without PostFilter
     (`--no-preemption`, or DefaultPreemption disabled) and after a scheduling error or a failed binding, the pod's
     nomination is cleared (clearNominatedNode), as upstream does. `preemption` is on by default, as
     DefaultPreemption is in kube-scheduler's default profile.
DRA (`resource.k8s.io/v1`): testbed/dra_scheduling.py adds kube-scheduler's DynamicResources plugin (pods wait
for their claims, the in-tree filters are followed by structured-parameters allocation per node, PreBind writes the
allocations and reservations before the binding; extended resources served by DRA skip the in-tree fit on nodes
that do not advertise them) and kube-controller-manager's resourceclaim controller (claims from templates, release
when pods end); `--no-dra` leaves claims alone. `--kubernetes-version 1.35` (1.34 to 1.36, default 1.36) makes
the structured allocator answer as that release's does (see testbed/dra_allocator.py).
A failed cycle records a `FailedScheduling` event and the `PodScheduled=False` condition with the reasons
("0/3 nodes are available: 3 insufficient memory.") and puts the pod back with backoff (1 s doubling to 10 s, as
kube-scheduler's podInitialBackoffSeconds / podMaxBackoffSeconds); unschedulable pods are retried when a node or
a pod changes in a way that may free room, and at the latest after `unschedulable_flush` seconds. Every call to an
extender is bounded by its `httpTimeout` (default 5 s). Scheduling cycles are serial, bindings run concurrently.

Run: `python -m vgpu.testbed.scheduler_driver --config deploy/scheduler/configmap.yaml --kubeconfig K
[--extender-url http://127.0.0.1:PORT] [--trace FILE] [--kubernetes-version 1.36]`; it prints `ready` on stdout
once its caches are synced.
With `--trace`, one JSON line per bound pod records the timing (used by bench/bench_e2e.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import logging
import random
import re
import signal
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from vgpu.testbed.dra_allocator import (
    DEFAULT_KUBERNETES_VERSION,
    AllocationError,
    KubernetesVersion,
    parse_kubernetes_version,
)
from vgpu.testbed.dra_scheduling import DraBindError, DynamicResources, PodDra
from vgpu.testbed.kubemath import pod_requests, resource_amount
from vgpu.testbed.preemption import (
    DEFAULT_MIN_CANDIDATE_NODES_ABSOLUTE,
    DEFAULT_MIN_CANDIDATE_NODES_PERCENTAGE,
    ERROR,
    NO_CANDIDATE,
    UNRESOLVABLE,
    UNSCHEDULABLE,
    NodeStatus,
    Victims,
    aggregate_errors,
    disruption_target_condition,
    eligible_to_preempt,
    fit_error,
    nominated_node_name,
    now_rfc3339,
    num_candidates,
    pick_one_node,
    pod_priority,
    preempted_message,
    select_victims,
)

__all__ = [
    "BUILTIN_CONFIG",
    "ConfigError",
    "ExtenderConfig",
    "Profile",
    "SchedulerConfig",
    "SchedulerDriver",
    "find_deploy_config",
    "load_scheduler_config",
    "main",
    "parse_duration",
    "parse_scheduler_config",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
DEFAULT_EXTENDER_TIMEOUT = 5.0
INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 10.0
DEFAULT_MAX_PODS = 110
ASSUMED_POD_TTL = 30.0  # seconds an answered bind may wait for the informer to show spec.nodeName

# Only for unit tests of this driver: what deploy/ is expected to hold. Everything else reads deploy/'s file.
BUILTIN_CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: vgpu-scheduler
  percentageOfNodesToScore: 100
extenders:
- urlPrefix: http://127.0.0.1:8888
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: 1
  nodeCacheCapable: true
  httpTimeout: 30s
  ignorable: false
  managedResources:
  - {name: volcano.sh/vgpu-number, ignoredByScheduler: true}
  - {name: volcano.sh/vgpu-memory, ignoredByScheduler: true}
  - {name: volcano.sh/vgpu-memory-percentage, ignoredByScheduler: true}
  - {name: volcano.sh/vgpu-cores, ignoredByScheduler: true}
"""


# ------------------------------------------------------------------------------------------------ configuration

class ConfigError(ValueError):
    """A scheduler configuration the driver cannot use (kube-scheduler refuses to start on it)."""


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """A metav1.Duration ("30s", "1m30s", "500ms") or a number of seconds, as seconds."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    if text in ("0", "+0", "-0"):
        return 0.0
    pos, total = 0, 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise ConfigError(f"duration {value!r}: not a Go duration such as 30s or 1m30s")
        total += float(match[1]) * _DURATION_UNIT[match[2]]
        pos = match.end()
    return total


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """One `extenders[]` entry of a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1 field names)."""

    url_prefix: str
    filter_verb: str = ""
    prioritize_verb: str = ""
    bind_verb: str = ""
    preempt_verb: str = ""
    weight: int = 1
    node_cache_capable: bool = False
    http_timeout: float = DEFAULT_EXTENDER_TIMEOUT
    ignorable: bool = False
    enable_https: bool = False
    tls: Obj = field(default_factory=dict)
    managed_resources: tuple[tuple[str, bool], ...] = ()

    def url(self, verb: str) -> str:
        """`strings.TrimRight(urlPrefix, "/") + "/" + verb`, as kube-scheduler builds it."""
        return self.url_prefix.rstrip("/") + "/" + verb

    @property
    def ignored_resources(self) -> frozenset[str]:
        """Resources kube-scheduler's in-tree fit skips because this extender accounts them."""
        return frozenset(name for name, ignored in self.managed_resources if ignored)

    def is_interested(self, pod: Obj) -> bool:
        """kube-scheduler's IsInterested: all pods when managedResources is empty, else pods asking for one."""
        if not self.managed_resources:
            return True
        names = {name for name, _ in self.managed_resources}
        spec = pod.get("spec") or {}
        for ctr in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
            res = (ctr or {}).get("resources") or {}
            for table in (res.get("requests") or {}, res.get("limits") or {}):
                if names & set(table):
                    return True
        return False


@dataclass(frozen=True, slots=True)
class Profile:
    """One `profiles[]` entry."""

    scheduler_name: str = "default-scheduler"
    percentage_of_nodes_to_score: int = 0
    ignored_resources: frozenset[str] = frozenset()  # pluginConfig NodeResourcesFit args.ignoredResources
    ignored_groups: frozenset[str] = frozenset()  # pluginConfig NodeResourcesFit args.ignoredResourceGroups
    default_preemption: bool = True  # the PostFilter plugin DefaultPreemption is enabled (kube-scheduler's default)
    min_candidate_nodes_percentage: int = DEFAULT_MIN_CANDIDATE_NODES_PERCENTAGE  # DefaultPreemptionArgs
    min_candidate_nodes_absolute: int = DEFAULT_MIN_CANDIDATE_NODES_ABSOLUTE


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The parts of a KubeSchedulerConfiguration this driver obeys."""

    profiles: tuple[Profile, ...]
    extenders: tuple[ExtenderConfig, ...]
    percentage_of_nodes_to_score: int = 0
    source: str = ""

    def with_extender_url(self, url: str) -> SchedulerConfig:
        """The same configuration with every extender's scheme://host:port replaced by `url` (path kept)."""
        new = []
        base = httpx.URL(url)
        for ext in self.extenders:
            old = httpx.URL(ext.url_prefix)
            prefix = str(old.copy_with(scheme=base.scheme, host=base.host, port=base.port)).rstrip("/")
            new.append(dataclasses.replace(ext, url_prefix=prefix, enable_https=base.scheme == "https"))
        return SchedulerConfig(self.profiles, tuple(new), self.percentage_of_nodes_to_score, self.source)

    def ignored(self, profile: Profile) -> tuple[frozenset[str], frozenset[str]]:
        """The extended-resource names and groups NodeResourcesFit skips for a profile: the extenders'
        `ignoredByScheduler` names, when there are any, replace the profile's own `ignoredResources`."""
        from_extenders = frozenset().union(*(e.ignored_resources for e in self.extenders))
        return from_extenders or profile.ignored_resources, profile.ignored_groups

    @property
    def scheduler_names(self) -> frozenset[str]:
        """Names of the profiles; pods with another schedulerName are left alone."""
        return frozenset(p.scheduler_name for p in self.profiles)


def _documents(text: str, where: str) -> Iterator[Obj]:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not YAML: {exc}") from None
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "ConfigMap":
            for key, value in (doc.get("data") or {}).items():
                if isinstance(value, str) and "KubeSchedulerConfiguration" in value:
                    yield from _documents(value, f"{where} ConfigMap data {key}")
        elif doc.get("kind") == "List":
            for item in doc.get("items") or ():
                yield from _documents(yaml.safe_dump(item), where)
        else:
            yield doc


def parse_scheduler_config(text: str, where: str = "<config>") -> SchedulerConfig:
    """Parse a KubeSchedulerConfiguration found in `text` (bare, in a ConfigMap, or in a multi-document file)."""
    doc = next((d for d in _documents(text, where) if d.get("kind") == "KubeSchedulerConfiguration"), None)
    if doc is None:
        raise ConfigError(f"{where}: no KubeSchedulerConfiguration document found")
    api_version = str(doc.get("apiVersion") or "")
    if not api_version.startswith("kubescheduler.config.k8s.io/"):
        raise ConfigError(f"{where}: apiVersion {api_version!r} is not kubescheduler.config.k8s.io/*")
    top_pct = int(doc.get("percentageOfNodesToScore") or 0)
    profiles = tuple(
        _profile(p, top_pct, where)
        for p in doc.get("profiles") or [{}]
        if isinstance(p, dict)
    ) or (Profile(),)
    extenders = []
    binders = 0
    for index, raw in enumerate(doc.get("extenders") or ()):
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: extenders[{index}] is not a mapping")
        prefix = str(raw.get("urlPrefix") or "")
        if not prefix:
            raise ConfigError(f"{where}: extenders[{index}].urlPrefix: required")
        weight = int(raw.get("weight") or 0)
        if raw.get("prioritizeVerb") and weight <= 0:
            raise ConfigError(f"{where}: extenders[{index}].weight: must be positive with a prioritizeVerb")
        managed = []
        for res in raw.get("managedResources") or ():
            if not isinstance(res, dict) or not res.get("name"):
                raise ConfigError(f"{where}: extenders[{index}].managedResources: entries need a name")
            managed.append((str(res["name"]), bool(res.get("ignoredByScheduler", False))))
        if raw.get("bindVerb"):
            binders += 1
        timeout = parse_duration(raw.get("httpTimeout")) or DEFAULT_EXTENDER_TIMEOUT
        extenders.append(ExtenderConfig(
            url_prefix=prefix,
            filter_verb=str(raw.get("filterVerb") or ""),
            prioritize_verb=str(raw.get("prioritizeVerb") or ""),
            bind_verb=str(raw.get("bindVerb") or ""),
            preempt_verb=str(raw.get("preemptVerb") or ""),
            weight=weight or 1,
            node_cache_capable=bool(raw.get("nodeCacheCapable", False)),
            http_timeout=timeout,
            ignorable=bool(raw.get("ignorable", False)),
            enable_https=bool(raw.get("enableHTTPS", raw.get("enableHttps", False))),
            tls=dict(raw.get("tlsConfig") or {}),
            managed_resources=tuple(managed),
        ))
    if binders > 1:
        raise ConfigError(f"{where}: only one extender can implement bind, found {binders}")
    return SchedulerConfig(profiles, tuple(extenders), top_pct, where)


def _profile(doc: Obj, top_pct: int, where: str) -> Profile:
    ignored, groups = _fit_ignored(doc, where)
    percentage, absolute = _preemption_args(doc, where)
    return Profile(scheduler_name=str(doc.get("schedulerName") or "default-scheduler"),
                   percentage_of_nodes_to_score=int(doc.get("percentageOfNodesToScore") or top_pct),
                   ignored_resources=ignored, ignored_groups=groups,
                   default_preemption=_post_filter_enabled(doc, where),
                   min_candidate_nodes_percentage=percentage, min_candidate_nodes_absolute=absolute)


def _post_filter_enabled(profile: Obj, where: str) -> bool:
    """Whether the profile keeps DefaultPreemption at PostFilter: kube-scheduler's default plugins are all
    multiPoint; `disabled` (postFilter or multiPoint) by name or `'*'` drops it, unless `enabled` lists it."""
    plugins = profile.get("plugins") or {}
    if not isinstance(plugins, dict):
        raise ConfigError(f"{where}: profiles[].plugins: must be a mapping")
    names: dict[str, set[str]] = {"enabled": set(), "disabled": set()}
    for point in ("multiPoint", "postFilter"):
        section = plugins.get(point) or {}
        if not isinstance(section, dict):
            raise ConfigError(f"{where}: profiles[].plugins.{point}: must be a mapping")
        for kind in names:
            for entry in section.get(kind) or ():
                if not isinstance(entry, dict) or not entry.get("name"):
                    raise ConfigError(f"{where}: profiles[].plugins.{point}.{kind}: entries need a name")
                names[kind].add(str(entry["name"]))
    if "DefaultPreemption" in names["enabled"]:
        return True
    return not names["disabled"] & {"DefaultPreemption", "*"}


def _preemption_args(profile: Obj, where: str) -> tuple[int, int]:
    """DefaultPreemptionArgs (defaults 10 and 100), checked as ValidateDefaultPreemptionArgs does."""
    args: Obj = {}
    for entry in profile.get("pluginConfig") or ():
        if isinstance(entry, dict) and entry.get("name") == "DefaultPreemption":
            args = entry.get("args") or {}
    values = []
    for key, default in (("minCandidateNodesPercentage", DEFAULT_MIN_CANDIDATE_NODES_PERCENTAGE),
                         ("minCandidateNodesAbsolute", DEFAULT_MIN_CANDIDATE_NODES_ABSOLUTE)):
        value = args.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}: pluginConfig DefaultPreemption args.{key}: must be an integer")
        values.append(value)
    percentage, absolute = values
    prefix = f"{where}: pluginConfig DefaultPreemption args"
    if not 0 <= percentage <= 100:
        raise ConfigError(f"{prefix}.minCandidateNodesPercentage: Invalid value: {percentage}: not in valid range "
                          f"[0, 100]")
    if absolute < 0:
        raise ConfigError(f"{prefix}.minCandidateNodesAbsolute: Invalid value: {absolute}: not in valid range "
                          f"[0, inf)")
    if percentage == 0 and absolute == 0:
        raise ConfigError(f"{prefix}.minCandidateNodesPercentage: Invalid value: 0: cannot be zero at the same "
                          f"time as minCandidateNodesAbsolute")
    return percentage, absolute


def _fit_ignored(profile: Obj, where: str) -> tuple[frozenset[str], frozenset[str]]:
    """`ignoredResources` and `ignoredResourceGroups` of a profile's NodeResourcesFit args (empty without them)."""
    for entry in profile.get("pluginConfig") or ():
        if not isinstance(entry, dict) or entry.get("name") != "NodeResourcesFit":
            continue
        args = entry.get("args") or {}
        lists = []
        for key in ("ignoredResources", "ignoredResourceGroups"):
            values = args.get(key) or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ConfigError(f"{where}: pluginConfig NodeResourcesFit args.{key}: must be a list of strings")
            lists.append(frozenset(values))
        return lists[0], lists[1]
    return frozenset(), frozenset()


def load_scheduler_config(path: str | Path) -> SchedulerConfig:
    """Read and parse a KubeSchedulerConfiguration file (or a ConfigMap manifest holding one)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"scheduler config {path}: {exc.strerror or exc}") from None
    return parse_scheduler_config(text, str(path))


def find_deploy_config(root: str | Path | None = None, dra: bool = False) -> Path | None:
    """The file under deploy/ that holds the KubeSchedulerConfiguration (with `dra`, DRA mode's, under deploy/dra/),
    or None if deploy/ has none yet."""
    base = Path(root) if root else Path(__file__).resolve().parents[1]
    deploy = base / "deploy"
    if not deploy.is_dir():
        return None
    candidates = [p for p in sorted(deploy.rglob("*.yaml")) + sorted(deploy.rglob("*.yml"))
                  if (p.relative_to(deploy).parts[0] == "dra") == dra]
    candidates.sort(key=lambda p: (0 if "scheduler" in str(p.relative_to(deploy)) else 1, str(p)))
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        if "KubeSchedulerConfiguration" not in text:
            continue
        try:
            parse_scheduler_config(text, str(path))
        except ConfigError:
            continue
        return path
    return None


# ---------------------------------------------------------------------------------------------- resource fit

_BASE_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def _tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _terminal(pod: Obj) -> bool:
    return ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed")


# ------------------------------------------------------------------------------------------------- API access

class _Api:
    """The few API-server calls the driver makes, with plain-dict objects (official client, raw JSON)."""

    def __init__(self, kubeconfig: str | None) -> None:
        from kubernetes import client as k8s

        from vgpu.testbed.kubeclient import api_client

        self.client = api_client(kubeconfig, pool_size=64)
        self.core: Any = k8s.CoreV1Api(self.client)  # raw JSON calls: the client's model types do not apply

    @staticmethod
    def _json(resp: Any) -> Any:
        from vgpu.testbed.kubeclient import read_json

        return read_json(resp)

    def list(self, kind: str) -> Obj:
        """List all pods or nodes."""
        if kind == "pods":
            return self._json(self.core.list_pod_for_all_namespaces(_preload_content=False))
        return self._json(self.core.list_node(_preload_content=False))

    def watch(self, kind: str, rv: str, timeout: int = 240) -> Iterator[Obj]:
        """Watch events from resourceVersion `rv`; ends when the server closes the stream."""
        from kubernetes.watch import watch as k8s_watch

        iter_resp_lines: Any = k8s_watch.iter_resp_lines

        kwargs = dict(watch=True, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=timeout,
                      _preload_content=False, _request_timeout=(5, timeout + 30))
        if kind == "pods":
            resp = self.core.list_pod_for_all_namespaces(**kwargs)
        else:
            resp = self.core.list_node(**kwargs)
        try:
            for line in iter_resp_lines(resp):
                if line:
                    yield orjson.loads(line)
        finally:
            resp.release_conn()

    def bind(self, pod: Obj, node: str) -> None:
        """The default binder: POST pods/{name}/binding."""
        meta = pod["metadata"]
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta.get("namespace") or "default",
                             "uid": meta.get("uid")},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self.core.create_namespaced_pod_binding(meta["name"], meta.get("namespace") or "default", body,
                                              _preload_content=False)

    def patch_status(self, pod: Obj, patch: Obj) -> None:
        """Strategic-merge patch of pods/{name}/status."""
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(meta["name"], meta.get("namespace") or "default", patch,
                                              _preload_content=False)

    def delete_pod(self, pod: Obj) -> None:
        """DELETE the pod (util.DeletePod: no options, so the pod's own grace period)."""
        meta = pod["metadata"]
        self.core.delete_namespaced_pod(meta["name"], meta.get("namespace") or "default", _preload_content=False)

    def create_event(self, namespace: str, body: Obj) -> None:
        """Create a core/v1 Event."""
        self.core.create_namespaced_event(namespace, body, _preload_content=False)

    def patch_event(self, namespace: str, name: str, patch: Obj) -> None:
        """Merge-patch a core/v1 Event (count, lastTimestamp)."""
        self.core.patch_namespaced_event(name, namespace, patch, _preload_content=False)

    def close(self) -> None:
        """Release the connection pool."""
        self.client.close()


# ------------------------------------------------------------------------------------------------ the driver

class _ExtenderError(Exception):
    """An extender call failed (transport, non-200, undecodable body or a non-empty Error)."""


def _field(doc: Any, name: str) -> Any:
    """A Go-style case-insensitive field lookup in a decoded JSON object."""
    if not isinstance(doc, dict):
        return None
    if name in doc:
        return doc[name]
    lowered = name.lower()
    for key, value in doc.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def _short(exc: BaseException) -> str:
    """The first line of an exception's text, for a log line."""
    text = str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _not_found(exc: BaseException) -> bool:
    """An API answer of 404 (the official client's ApiException)."""
    return getattr(exc, "status", None) == 404


@dataclass(slots=True)
class _Cycle:
    """What one scheduling cycle sees (kube-scheduler's snapshot plus the nominator's pods)."""

    nodes: dict[str, Obj]
    usage: dict[str, dict[str, Fraction]]
    on_node: dict[str, list[Obj]]
    nominated: dict[str, list[Obj]]


@dataclass(slots=True)
class _QueuedPod:
    attempts: int = 0
    backoff_until: float = 0.0
    unschedulable_since: float = 0.0
    last_message: str = ""
    event_name: str = ""
    event_count: int = 0
    first_seen: float = 0.0


class SchedulerDriver:
    """The kube-scheduler stand-in: caches, a serial scheduling loop, concurrent bindings."""

    def __init__(self, config: SchedulerConfig, kubeconfig: str | None, trace: str | None = None,
                 unschedulable_flush: float = 30.0, bind_workers: int = 16, seed: int | None = None,
                 api: Any = None, dra: bool = True,
                 kubernetes_version: KubernetesVersion = DEFAULT_KUBERNETES_VERSION,
                 preemption: bool = True) -> None:
        self.config = config
        # PostFilter: DefaultPreemption for the profiles that keep it (see the module docstring for the default)
        self.preemption = preemption
        self.profiles = {p.scheduler_name: p for p in config.profiles}
        self.kubernetes_version = parse_kubernetes_version(kubernetes_version)
        self.api = api if api is not None else _Api(kubeconfig)
        # DRA (testbed/dra_scheduling.py): the DynamicResources plugin and the resourceclaim controller
        self.dra = DynamicResources(self.api.client, self._dra_changed, self._cached_pod, self.kubernetes_version) \
            if dra and hasattr(self.api, "client") else None
        self.names = config.scheduler_names
        self.unschedulable_flush = unschedulable_flush
        self.random = random.Random(seed)
        self.lock = threading.Condition()
        self.pods: dict[str, Obj] = {}
        self.nodes: dict[str, Obj] = {}
        self.assumed: dict[str, tuple[str, Obj]] = {}  # pod key -> (node, pod)
        self.bound_at: dict[str, float] = {}  # pod key -> when its bind was answered (assumed until seen bound)
        self.queue_state: dict[str, _QueuedPod] = {}
        self.nominated: dict[str, tuple[str, Obj]] = {}  # the nominator: pod key -> (nominated node, pod)
        self.preempting: dict[str, str] = {}  # preemptor key -> its last victim's key ("" until registered)
        self.active: list[tuple[float, str]] = []  # heap of (enqueue time, key)
        self.in_active: set[str] = set()
        self.in_flight: set[str] = set()
        # moveRequestCycle: a pod whose cycle saw a requeueing event go by is not parked as unschedulable
        self.flush_seq = 0
        self.cycle_seq: dict[str, int] = {}
        self.stop_event = threading.Event()
        self.synced = {"pods": threading.Event(), "nodes": threading.Event()}
        self.binder = ThreadPoolExecutor(bind_workers, thread_name_prefix="bind")
        self.http: dict[int, httpx.Client] = {}
        self.stats: Counter[str] = Counter()
        self._trace_lock = threading.Lock()
        self._trace = open(trace, "ab", buffering=0) if trace else None  # noqa: SIM115 - closed in stop()
        self.threads: list[threading.Thread] = []
        self._request_cache: dict[Any, dict[str, Fraction]] = {}
        self.ignored = {p.scheduler_name: config.ignored(p) for p in config.profiles}
        pct = [p.percentage_of_nodes_to_score for p in config.profiles if p.percentage_of_nodes_to_score]
        self.percentage = pct[0] if pct else config.percentage_of_nodes_to_score

    # -- lifecycle
    def start(self, sync_timeout: float = 30.0) -> SchedulerDriver:
        """Start the reflectors and the scheduling loop; wait until both caches are synced."""
        for kind in ("nodes", "pods"):
            thread = threading.Thread(target=self._reflect, args=(kind,), name=f"reflect-{kind}", daemon=True)
            thread.start()
            self.threads.append(thread)
        for event in self.synced.values():
            if not event.wait(sync_timeout):
                raise RuntimeError("scheduler driver: caches did not sync (is the API server up?)")
        if self.dra is not None:
            self.dra.start(sync_timeout)
        loop = threading.Thread(target=self._loop, name="schedule", daemon=True)
        loop.start()
        self.threads.append(loop)
        return self

    def stop(self) -> None:
        """Stop scheduling; in-flight bindings finish."""
        self.stop_event.set()
        with self.lock:
            self.lock.notify_all()
        self.binder.shutdown(wait=True, cancel_futures=True)
        if self.dra is not None:
            self.dra.stop()
        for client in self.http.values():
            client.close()
        if self._trace is not None:
            self._trace.close()

    def _client(self, ext: ExtenderConfig) -> httpx.Client:
        key = id(ext)
        client = self.http.get(key)
        if client is None:
            verify: Any = True
            cert: Any = None
            if ext.enable_https or ext.url_prefix.startswith("https"):
                tls = ext.tls
                if tls.get("insecure") or not (tls.get("caFile") or tls.get("caData")):
                    verify = False
                elif tls.get("caFile"):
                    verify = ssl.create_default_context(cafile=tls["caFile"])
                if tls.get("certFile") and tls.get("keyFile"):
                    cert = (tls["certFile"], tls["keyFile"])
            client = httpx.Client(timeout=ext.http_timeout, verify=verify, cert=cert,
                                  limits=httpx.Limits(max_connections=32, max_keepalive_connections=32))
            self.http[key] = client
        return client

    def _record(self, **fields: Any) -> None:
        if self._trace is None:
            return
        fields.setdefault("t", time.time())
        with self._trace_lock:
            self._trace.write(orjson.dumps(fields) + b"\n")

    # -- reflectors
    def _reflect(self, kind: str) -> None:
        rv = ""
        while not self.stop_event.is_set():
            try:
                if not rv:
                    listing = self.api.list(kind)
                    rv = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                    self._replace(kind, listing.get("items") or [])
                    self.synced[kind].set()
                for event in self.api.watch(kind, rv):
                    if self.stop_event.is_set():
                        return
                    typ, obj = event.get("type"), event.get("object") or {}
                    if typ == "ERROR":
                        rv = ""  # 410 Gone or another failure: relist
                        break
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = str(new_rv)
                    if typ == "BOOKMARK":
                        continue
                    self._apply(kind, typ, obj)
            except Exception as exc:
                if self.stop_event.is_set():
                    return
                log.info("reflector kind=%s error=%s", kind, str(exc).splitlines()[0][:200] if str(exc) else exc)
                rv = ""
                self.stop_event.wait(0.5)

    def _replace(self, kind: str, items: list[Obj]) -> None:
        with self.lock:
            if kind == "nodes":
                self.nodes = {str((o.get("metadata") or {}).get("name")): o for o in items}
                self._flush_unschedulable("node list")
                return
            fresh = {_pod_key(o): o for o in items}
            for key in list(self.pods):
                if key not in fresh:
                    self._forget_pod(key)
            old_pods, self.pods = self.pods, fresh
            for key, pod in fresh.items():
                if self.dra is not None:
                    self.dra.pod_event(None, pod)
                self._track_nomination(key, old_pods.get(key), pod)
                self._consider(key, pod)

    def _apply(self, kind: str, typ: str | None, obj: Obj) -> None:
        with self.lock:
            if kind == "nodes":
                name = str((obj.get("metadata") or {}).get("name"))
                if typ == "DELETED":
                    self.nodes.pop(name, None)
                else:
                    self.nodes[name] = obj
                    self._flush_unschedulable("node event")
                return
            key = _pod_key(obj)
            if typ == "DELETED":
                self.pods.pop(key, None)
                self._forget_pod(key)
                self._flush_unschedulable("pod deleted")
                if self.dra is not None:
                    self.dra.pod_event(obj, None)
                return
            old = self.pods.get(key)
            self.pods[key] = obj
            self._track_nomination(key, old, obj)
            if old is not None and _terminal(obj) and not _terminal(old):
                self._flush_unschedulable("pod finished")
            if self.dra is not None and self.dra.pod_event(old, obj):
                self._flush_unschedulable("pod claims recorded")
            self._consider(key, obj)

    def _cached_pod(self, namespace: str, name: str) -> Obj | None:
        return self.pods.get(f"{namespace}/{name}")

    def _dra_changed(self, why: str) -> None:
        with self.lock:
            self._flush_unschedulable(why)

    def _track_nomination(self, key: str, old: Obj | None, new: Obj) -> None:
        """Caller holds the lock. The nominator's updateNominatedPod: a pod update keeps an in-memory nomination
        only when neither version carries status.nominatedNodeName, else the new status decides; a pod that is
        bound, finished or not ours is nominated nowhere."""
        if not self._wants(new):
            self.nominated.pop(key, None)
            return
        if not nominated_node_name(old) and not nominated_node_name(new) and key in self.nominated:
            self.nominated[key] = (self.nominated[key][0], new)
        elif nominated_node_name(new):
            self.nominated[key] = (nominated_node_name(new), new)
        else:
            self.nominated.pop(key, None)

    def _forget_pod(self, key: str) -> None:
        self.nominated.pop(key, None)
        self.cycle_seq.pop(key, None)
        self.assumed.pop(key, None)
        self.bound_at.pop(key, None)
        self.queue_state.pop(key, None)
        self.in_active.discard(key)

    def _wants(self, pod: Obj) -> bool:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        return (spec.get("schedulerName") or "default-scheduler") in self.names and not spec.get("nodeName") \
            and not meta.get("deletionTimestamp") and not _terminal(pod)

    def _consider(self, key: str, pod: Obj) -> None:
        """Caller holds the lock. Queue a pod that needs scheduling; drop state of pods that got a node."""
        if (pod.get("spec") or {}).get("nodeName"):
            self.assumed.pop(key, None)  # the binding landed; the informer copy now counts on its node
            self.bound_at.pop(key, None)
            self.queue_state.pop(key, None)
            self.in_active.discard(key)
            return
        if not self._wants(pod):
            return
        if key in self.in_flight or key in self.in_active or key in self.assumed:
            return
        state = self.queue_state.get(key)
        if state is None:
            state = self.queue_state[key] = _QueuedPod(first_seen=time.time())
            self._push(key, time.monotonic())
        # a known pod waiting in backoff or unschedulable stays there until its time comes

    def _push(self, key: str, when: float) -> None:
        heapq.heappush(self.active, (when, key))
        self.in_active.add(key)
        self.lock.notify_all()

    def _flush_unschedulable(self, why: str) -> None:
        """Caller holds the lock. Move unschedulable pods back to the queue (they keep their backoff)."""
        self.flush_seq += 1
        moved = 0
        for key, state in self.queue_state.items():
            if state.unschedulable_since and key not in self.in_active and key not in self.in_flight:
                state.unschedulable_since = 0.0
                self._push(key, max(state.backoff_until, time.monotonic()))
                moved += 1
        if moved:
            log.debug("requeue unschedulable pods=%d why=%s", moved, why)

    # -- the scheduling loop
    def _next(self) -> str | None:
        with self.lock:
            while not self.stop_event.is_set():
                now = time.monotonic()
                # an answered bind the informer never confirms expires, as kube-scheduler's assumed pods do
                for key, when in list(self.bound_at.items()):
                    if now - when > ASSUMED_POD_TTL:
                        del self.bound_at[key]
                        if self.assumed.pop(key, None) is not None:
                            log.info("assumed pod expired without a binding pod=%s", key)
                            self._push(key, now)
                # periodic flush of pods that have been unschedulable for too long
                for key, state in self.queue_state.items():
                    if state.unschedulable_since and now - state.unschedulable_since > self.unschedulable_flush \
                            and key not in self.in_active and key not in self.in_flight:
                        state.unschedulable_since = 0.0
                        self._push(key, max(state.backoff_until, now))
                if self.active and self.active[0][0] <= now:
                    _, key = heapq.heappop(self.active)
                    if key not in self.in_active:
                        continue
                    self.in_active.discard(key)
                    pod = self.pods.get(key)
                    if pod is None or not self._wants(pod) or key in self.assumed:
                        continue
                    if key in self.preempting and self._running_preemption(key):
                        # DefaultPreemption's PreEnqueue: "waiting for the preemption for this pod to be finished";
                        # the pod waits with the unschedulable ones until a pod deletion moves it again
                        held = self.queue_state.get(key)
                        if held is not None:
                            held.unschedulable_since = now
                        continue
                    self.in_flight.add(key)
                    return key
                wait = 1.0 if not self.active else min(1.0, max(0.0, self.active[0][0] - now))
                self.lock.wait(wait)
        return None

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            key = self._next()
            if key is None:
                return
            try:
                self.schedule_one(key)
            except Exception:
                log.exception("scheduling cycle failed pod=%s", key)
                with self.lock:
                    self.in_flight.discard(key)
                    self._requeue_with_backoff(key, "internal error")

    def _running_preemption(self, key: str) -> bool:
        """Caller holds the lock. Evaluator.IsPodRunningPreemption: until the last victim is gone or being
        deleted."""
        last = self.preempting.get(key)
        if last is None:
            return False
        if not last:
            return True
        victim = self.pods.get(last)
        return victim is not None and not (victim.get("metadata") or {}).get("deletionTimestamp")

    def _nominated_by_node(self) -> dict[str, list[Obj]]:
        """Caller holds the lock. The nominator's pods per node."""
        out: dict[str, list[Obj]] = {}
        for node, pod in self.nominated.values():
            out.setdefault(node, []).append(pod)
        return out

    def _snapshot(self) -> tuple[dict[str, dict[str, Fraction]], dict[str, list[Obj]]]:
        """Caller holds the lock. Requests of running/pending pods per node and the pods themselves, assumed pods
        included (kube-scheduler's NodeInfo)."""
        usage: dict[str, dict[str, Fraction]] = {}
        on_node: dict[str, list[Obj]] = {}
        counted: set[str] = set()

        def add(node: str, pod: Obj) -> None:
            table = usage.setdefault(node, {"pods": Fraction(0)})
            table["pods"] += 1
            on_node.setdefault(node, []).append(pod)
            for name, value in self._requests(pod).items():
                table[name] = table.get(name, Fraction(0)) + value

        for key, pod in self.pods.items():
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not _terminal(pod):
                add(node, pod)
                counted.add(key)
        for key, (node, pod) in self.assumed.items():
            if key not in counted:
                add(node, pod)
        return usage, on_node

    def _requests(self, pod: Obj) -> dict[str, Fraction]:
        """kubemath.pod_requests, cached per pod uid (a pod's requests never change)."""
        uid = (pod.get("metadata") or {}).get("uid") or id(pod)
        found = self._request_cache.get(uid)
        if found is None:
            if len(self._request_cache) > 100000:
                self._request_cache.clear()
            found = self._request_cache[uid] = pod_requests(pod)
        return found

    def _in_tree_status(self, pod: Obj, node: Obj, used: dict[str, Fraction]) -> NodeStatus | None:
        """kube-scheduler's default filter plugins on one node: None when it passes, else the reasons (all of them,
        where kube-scheduler stops at the first failing plugin) and the status code of the first failing plugin
        in kube-scheduler's order: NodeUnschedulable, TaintToleration and NodeAffinity answer
        UnschedulableAndUnresolvable; NodeResourcesFit answers Unschedulable unless a request exceeds the node's
        whole allocatable (fit.go: `Unresolvable: podRequest > allocatable`)."""
        spec = pod.get("spec") or {}
        nspec = node.get("spec") or {}
        reasons = []
        if nspec.get("unschedulable"):
            tolerated = any(t.get("key") == "node.kubernetes.io/unschedulable" for t in spec.get("tolerations") or ())
            if not tolerated:
                reasons.append("node(s) were unschedulable")
        for taint in nspec.get("taints") or ():
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(spec.get("tolerations") or [],
                                                                                      taint):
                reasons.append(f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}")
                break
        labels = (node.get("metadata") or {}).get("labels") or {}
        selector = spec.get("nodeSelector") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            reasons.append("node(s) didn't match Pod's node affinity/selector")
        code = UNRESOLVABLE if reasons else UNSCHEDULABLE
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        max_pods = resource_amount("pods", allocatable.get("pods", DEFAULT_MAX_PODS))
        if used.get("pods", Fraction(0)) + 1 > max_pods:
            reasons.append("Too many pods")
        ignored, ignored_groups = self.ignored.get(spec.get("schedulerName") or "default-scheduler",
                                                   (frozenset(), frozenset()))
        for name, value in self._requests(pod).items():
            if value <= 0 or name in ignored or name.split("/", 1)[0] in ignored_groups:
                continue
            if name not in _BASE_RESOURCES and "/" not in name:
                continue
            if self.dra is not None and self.dra.serves_extended(name, node):
                continue  # KEP-5004: the DynamicResources filter allocates it on this node
            have = resource_amount(name, allocatable[name]) if name in allocatable else Fraction(0)
            if value > have - used.get(name, Fraction(0)):
                reasons.append(f"Insufficient {name}")
                if value > have:
                    code = UNRESOLVABLE
        return NodeStatus(code, tuple(dict.fromkeys(reasons))) if reasons else None

    def _filter_with_nominated(self, pod: Obj, node: Obj, used: dict[str, Fraction],
                               nominated: list[Obj] | None) -> NodeStatus | None:
        """RunFilterPluginsWithNominatedPods for the in-tree filters: first with the pods of equal or higher
        priority nominated to the node counted on it (addGENominatedPods), then, if any was added and that
        passed, without them."""
        priority = pod_priority(pod)
        uid = (pod.get("metadata") or {}).get("uid")
        added = [other for other in nominated or ()
                 if pod_priority(other) >= priority and (other.get("metadata") or {}).get("uid") != uid]
        if added:
            with_nominated = dict(used)
            for other in added:
                with_nominated["pods"] = with_nominated.get("pods", Fraction(0)) + 1
                for name, value in self._requests(other).items():
                    with_nominated[name] = with_nominated.get(name, Fraction(0)) + value
            status = self._in_tree_status(pod, node, with_nominated)
            if status is not None:
                return status
        return self._in_tree_status(pod, node, used)

    def _node_filter(self, pod: Obj, node: Obj, cycle: _Cycle, dra_state: PodDra | None) -> NodeStatus | None:
        """All filter plugins on one node (the in-tree ones with the nominated pods, then DynamicResources, whose
        statuses are UnschedulableAndUnresolvable); AllocationError propagates."""
        name = str((node.get("metadata") or {}).get("name"))
        status = self._filter_with_nominated(pod, node, cycle.usage.get(name, {}), cycle.nominated.get(name))
        if status is None and self.dra is not None and dra_state is not None:
            reason = self.dra.filter(pod, dra_state, node)
            if reason:
                status = NodeStatus(UNRESOLVABLE, (reason,))
        return status

    def _in_tree_score(self, pod: Obj, node: Obj, used: dict[str, Fraction]) -> int:
        """NodeResourcesFit LeastAllocated on cpu and memory, 0..100."""
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        requests = self._requests(pod)
        scores = []
        for name in ("cpu", "memory"):
            have = resource_amount(name, allocatable.get(name, 0))
            if have <= 0:
                continue
            left = have - used.get(name, Fraction(0)) - requests.get(name, Fraction(0))
            scores.append(max(Fraction(0), left) * MAX_NODE_SCORE / have)
        return int(sum(scores) / len(scores)) if scores else 0

    def _num_feasible_to_find(self, total: int) -> int:
        """kube-scheduler's numFeasibleNodesToFind."""
        if total < 100 or self.percentage >= 100:
            return total
        pct = self.percentage or max(5, 50 - total // 125)
        return max(100, total * pct // 100)

    def _post(self, ext: ExtenderConfig, verb: str, body: Any) -> Any:
        try:
            resp = self._client(ext).post(ext.url(verb), content=orjson.dumps(body),
                                          headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            raise _ExtenderError(f"failed {verb} with extender at URL {ext.url(verb)}: {exc!s}"[:300]) from None
        if resp.status_code != 200:
            raise _ExtenderError(f"failed {verb} with extender at URL {ext.url(verb)}, code {resp.status_code}")
        try:
            return orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            raise _ExtenderError(f"extender {ext.url(verb)}: answer is not JSON") from None

    def _extender_filter(self, ext: ExtenderConfig, pod: Obj, names: list[str],
                         nodes: dict[str, Obj]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        if ext.node_cache_capable:
            args = {"Pod": pod, "Nodes": None, "NodeNames": names}
        else:
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": [nodes[n] for n in names]}, "NodeNames": None}
        result = self._post(ext, ext.filter_verb, args)
        error = _field(result, "Error")
        if error:
            raise _ExtenderError(str(error))
        failed = dict(_field(result, "FailedNodes") or {})
        unresolvable = dict(_field(result, "FailedAndUnresolvableNodes") or {})
        if ext.node_cache_capable:
            kept = list(_field(result, "NodeNames") or [])
        else:
            kept = [((n or {}).get("metadata") or {}).get("name") for n in
                    ((_field(result, "Nodes") or {}).get("items") or [])]
        for name in kept:
            if name not in nodes or name not in names:
                raise _ExtenderError(f"extender {ext.url_prefix!r} claims a filtered node {name!r} which is not "
                                     f"found in the input node list")
        for name in unresolvable:
            failed.pop(name, None)
        return kept, failed, unresolvable

    def _extender_scores(self, ext: ExtenderConfig, pod: Obj, names: list[str],
                         nodes: dict[str, Obj]) -> dict[str, int]:
        if ext.node_cache_capable:
            args = {"Pod": pod, "Nodes": None, "NodeNames": names}
        else:
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": [nodes[n] for n in names]}, "NodeNames": None}
        result = self._post(ext, ext.prioritize_verb, args)
        scores = {}
        for entry in result if isinstance(result, list) else ():
            host, score = _field(entry, "Host"), _field(entry, "Score")
            if isinstance(host, str) and isinstance(score, int):
                scores[host] = score * ext.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        return scores

    def schedule_one(self, key: str) -> None:
        """One scheduling cycle for the pod `key`; on success the binding cycle is started."""
        started = time.monotonic()
        with self.lock:
            pod = self.pods.get(key)
            if pod is None or not self._wants(pod):
                self.in_flight.discard(key)
                return
            usage, on_node = self._snapshot()
            cycle = _Cycle(nodes=dict(self.nodes), usage=usage, on_node=on_node, nominated=self._nominated_by_node())
            self.cycle_seq[key] = self.flush_seq
        nodes = cycle.nodes
        total = len(nodes)
        dra_state: PodDra | None = None
        if self.dra is not None:
            dra_state, message, wait = self.dra.pre_filter(pod)
            if wait:
                self._wait_for_claims(key, message)
                return
            if message:
                # a PreFilter rejection: every node gets its status (UnschedulableAndUnresolvable), PostFilter runs
                nominating, post = self._post_filter(key, pod, cycle, {}, dra_state)
                self._fail(key, pod, "Unschedulable", f"0/{total} nodes are available: {message}." +
                           (f" {post}" if post else ""), started, nominating=nominating)
                return
        statuses: dict[str, NodeStatus] = {}
        feasible: list[str] = []
        nominated_node = nominated_node_name(pod)
        if nominated_node in nodes:
            feasible = self._evaluate_nominated_node(key, pod, nominated_node, cycle, dra_state)
        if not feasible:
            for name in sorted(nodes):
                try:
                    status = self._node_filter(pod, nodes[name], cycle, dra_state)
                except AllocationError as exc:
                    self._fail(key, pod, "SchedulerError", f'running "DynamicResources" filter plugin: {exc}',
                               started, nominating="")
                    return
                if status is not None:
                    statuses[name] = status
                else:
                    feasible.append(name)
            feasible = feasible[:self._num_feasible_to_find(total)]
            try:
                feasible = self._pass_extenders(key, pod, feasible, nodes, statuses)
            except _ExtenderError as exc:
                self._fail(key, pod, "SchedulerError", str(exc), started, nominating="")
                return
        if not feasible:
            counts: Counter[str] = Counter()
            for status in statuses.values():
                counts.update(status.reasons)
            parts = sorted(f"{count} {reason}" for reason, count in counts.items())
            nominating, post = "", ""
            if total:
                nominating, post = self._post_filter(key, pod, cycle, statuses, dra_state)
            message = f"0/{total} nodes are available" + (": " + ", ".join(parts) + "." if parts else
                                                          ":" if post else ".")
            self._fail(key, pod, "Unschedulable", message + (f" {post}" if post else ""), started,
                       nominating=nominating)
            return
        if len(feasible) == 1:
            chosen = feasible[0]
        else:
            scores = {name: self._in_tree_score(pod, nodes[name], cycle.usage.get(name, {})) for name in feasible}
            for ext in self.config.extenders:
                if not ext.prioritize_verb or not ext.is_interested(pod):
                    continue
                try:
                    for name, score in self._extender_scores(ext, pod, feasible, nodes).items():
                        if name in scores:
                            scores[name] += score
                except _ExtenderError as exc:
                    log.info("prioritize failed, no score from extender pod=%s error=%s", key, exc)
            best = max(scores.values())
            chosen = self.random.choice([name for name in feasible if scores[name] == best])
        with self.lock:
            self.assumed[key] = (chosen, pod)
            self.nominated.pop(key, None)  # assume: DeleteNominatedPodIfExists
            self.cycle_seq.pop(key, None)
        if self.dra is not None and dra_state is not None:
            self.dra.reserve(key, pod, dra_state, chosen)
        self.stats["scheduled"] += 1
        self.binder.submit(self._bind, key, pod, chosen, started, time.time(), dra_state)

    def _pass_extenders(self, key: str, pod: Obj, feasible: list[str], nodes: dict[str, Obj],
                        statuses: dict[str, NodeStatus] | None = None) -> list[str]:
        """findNodesThatPassExtenders: the interested extenders' filterVerb in turn over the nodes still feasible; an
        ignorable extender's error skips it, another's raises _ExtenderError naming the extender. With `statuses`,
        the nodes an extender refused get its reasons (FailedAndUnresolvableNodes, then FailedNodes)."""
        for ext in self.config.extenders:
            if not feasible:
                break
            if not ext.filter_verb or not ext.is_interested(pod):
                continue
            try:
                feasible, failed, unresolvable = self._extender_filter(ext, pod, feasible, nodes)
            except _ExtenderError as exc:
                if ext.ignorable:
                    log.info("ignorable extender failed filter pod=%s error=%s", key, exc)
                    continue
                raise _ExtenderError(f'running "{ext.url_prefix}" filter extender: {exc}') from exc
            if statuses is not None:
                for name, reason in unresolvable.items():
                    statuses[name] = NodeStatus(UNRESOLVABLE, (str(reason),))
                for name, reason in failed.items():
                    statuses[name] = NodeStatus(UNSCHEDULABLE, (str(reason),))
        return feasible

    def _evaluate_nominated_node(self, key: str, pod: Obj, name: str, cycle: _Cycle,
                                 dra_state: PodDra | None) -> list[str]:
        """evaluateNominatedNode: the filters and then the interested extenders' filterVerb on the nominated node
        alone; [name] when it passes. An error is logged and the cycle goes on with every node, as upstream."""
        try:
            if self._node_filter(pod, cycle.nodes[name], cycle, dra_state) is not None:
                return []
            return self._pass_extenders(key, pod, [name], cycle.nodes)
        except (AllocationError, _ExtenderError) as exc:
            log.info("evaluation failed on nominated node pod=%s node=%s error=%s", key, name, exc)
            return []

    # -- PostFilter: DefaultPreemption (testbed/preemption.py)
    def _post_filter(self, key: str, pod: Obj, cycle: _Cycle, statuses: dict[str, NodeStatus],
                     dra_state: PodDra | None) -> tuple[str | None, str]:
        """RunPostFilterPlugins after a FitError: (nominating, message). `nominating` is the PostFilterResult's
        NominatingInfo: None leaves the pod's nomination as it is, "" clears it, a name nominates that node;
        `message` is the PostFilter status message (with DefaultPreemption's "preemption: " prefix), "" when a node
        was nominated. Without a PostFilter plugin: clearNominatedNode and no message."""
        profile = self.profiles.get((pod.get("spec") or {}).get("schedulerName") or "default-scheduler")
        if not self.preemption or profile is None or not profile.default_preemption:
            return "", ""
        nominating, message = self._preempt(key, cycle, statuses, dra_state, profile)
        return nominating, f"preemption: {message}" if message else ""

    def _preempt(self, key: str, cycle: _Cycle, statuses: dict[str, NodeStatus], dra_state: PodDra | None,
                 profile: Profile) -> tuple[str | None, str]:
        """Evaluator.Preempt: (nominating, status message)."""
        with self.lock:
            pod = self.pods.get(key)  # 0) the latest version of the pod, from the informer's cache
        if pod is None:
            return None, f'pod "{key.split("/", 1)[-1]}" not found'
        nominated = nominated_node_name(pod)
        ok, why = eligible_to_preempt(pod, statuses.get(nominated, NodeStatus(UNRESOLVABLE)) if nominated else None,
                                      cycle.on_node.get(nominated, []) if nominated in cycle.nodes else None)
        if not ok:
            return None, why
        # findCandidates: the nodes whose status is Unschedulable may fit once pods are removed
        potential = [name for name in sorted(cycle.nodes)
                     if (status := statuses.get(name)) is not None and status.code == UNSCHEDULABLE]
        if not potential:
            return "", fit_error(len(cycle.nodes), {})
        offset = self.random.randrange(len(potential))
        wanted = num_candidates(len(potential), profile.min_candidate_nodes_percentage,
                                profile.min_candidate_nodes_absolute)
        candidates: dict[str, Victims] = {}
        node_statuses: dict[str, NodeStatus] = {}
        errors: list[str] = []
        for i in range(len(potential)):  # DryRunPreemption
            name = potential[(offset + i) % len(potential)]
            victims, status = self._select_victims(pod, name, cycle, dra_state)
            if status is None and victims:
                candidates[name] = Victims(victims)
                if len(candidates) >= wanted:
                    break
                continue
            if status is None:
                status = NodeStatus(ERROR, (f'expected at least one victim pod on node "{name}"',))
            if status.code == ERROR:
                errors.append(status.message)
            node_statuses[name] = status
        if not candidates:
            if errors:
                return None, aggregate_errors(errors)
            return "", fit_error(len(cycle.nodes), node_statuses)
        try:
            candidates = self._call_extenders(key, pod, candidates, cycle)
        except _ExtenderError as exc:
            return None, str(exc)
        order = list(candidates)
        self.random.shuffle(order)  # Go's map iteration order
        best = order[0] if len(order) == 1 else pick_one_node(candidates, order)
        if not best:
            return None, NO_CANDIDATE
        log.info("event=preempting preemptor=%s node=%s victims=%s", key, best,
                 ",".join(_pod_key(v) for v in candidates[best].pods))
        self._prepare_candidate_async(key, pod, best, candidates[best].pods)
        return best, ""

    def _select_victims(self, pod: Obj, name: str, cycle: _Cycle,
                        dra_state: PodDra | None) -> tuple[list[Obj], NodeStatus | None]:
        """SelectVictimsOnNode on a copy of the node: the filters run with the removed pods' requests taken off."""
        node = cycle.nodes[name]
        base = cycle.usage.get(name, {})
        dra_status: list[NodeStatus | None] = []  # DynamicResources has no PreFilterExtensions: one answer per node

        def fits(removed: Sequence[Obj]) -> NodeStatus | None:
            used = dict(base)
            for other in removed:
                used["pods"] = used.get("pods", Fraction(0)) - 1
                for resource, value in self._requests(other).items():
                    used[resource] = used.get(resource, Fraction(0)) - value
            status = self._filter_with_nominated(pod, node, used, cycle.nominated.get(name))
            if status is not None or self.dra is None or dra_state is None:
                return status
            if not dra_status:
                try:
                    reason = self.dra.filter(pod, dra_state, node)
                    dra_status.append(NodeStatus(UNRESOLVABLE, (reason,)) if reason else None)
                except AllocationError as exc:
                    dra_status.append(NodeStatus(ERROR, (f'running "DynamicResources" filter plugin: {exc}',)))
            return dra_status[0]

        return select_victims(pod, cycle.on_node.get(name, []), fits)

    def _call_extenders(self, key: str, pod: Obj, candidates: dict[str, Victims],
                        cycle: _Cycle) -> dict[str, Victims]:
        """Evaluator.callExtenders: each extender with a preemptVerb that is interested in the pod replaces the
        candidates with its answer; _ExtenderError fails the PostFilter (unless the extender is ignorable)."""
        if not self.config.extenders:
            return candidates
        victims = dict(candidates)
        for ext in self.config.extenders:
            if not ext.preempt_verb or not ext.is_interested(pod):
                continue
            try:
                answer = self._extender_preempt(ext, pod, victims, cycle)
            except _ExtenderError as exc:
                if ext.ignorable:
                    log.info("ignorable extender failed preemption pod=%s error=%s", key, exc)
                    continue
                raise
            for name, found in list(answer.items()):
                if not found.pods:
                    if ext.ignorable:
                        del answer[name]
                        continue
                    raise _ExtenderError(f'expected at least one victim pod on node "{name}"')
            victims = answer
            if not victims:
                break
        return victims

    def _extender_preempt(self, ext: ExtenderConfig, pod: Obj, victims: dict[str, Victims],
                          cycle: _Cycle) -> dict[str, Victims]:
        """HTTPExtender.ProcessPreemption: `POST {urlPrefix}/{preemptVerb}` with ExtenderPreemptionArgs, the answer's
        NodeNameToMetaVictims turned back into pods of the snapshot (convertToVictims)."""
        if ext.node_cache_capable:
            args: Obj = {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
                name: {"Pods": [{"UID": (p.get("metadata") or {}).get("uid")} for p in found.pods],
                       "NumPDBViolations": found.num_pdb_violations}
                for name, found in victims.items()}}
        else:
            args = {"Pod": pod, "NodeNameToMetaVictims": None, "NodeNameToVictims": {
                name: {"Pods": found.pods, "NumPDBViolations": found.num_pdb_violations}
                for name, found in victims.items()}}
        result = self._post(ext, ext.preempt_verb, args)
        answer: dict[str, Victims] = {}
        for name, meta_victims in (_field(result, "NodeNameToMetaVictims") or {}).items():
            if name not in cycle.nodes:
                raise _ExtenderError(f'nodeinfo not found for node name "{name}"')
            found = Victims(num_pdb_violations=int(_field(meta_victims, "NumPDBViolations") or 0))
            for meta_pod in _field(meta_victims, "Pods") or ():
                uid = _field(meta_pod, "UID")
                match = next((p for p in cycle.on_node.get(name, ()) if (p.get("metadata") or {}).get("uid") == uid),
                             None)
                if match is None:
                    raise _ExtenderError(f"extender: {ext.url_prefix} claims to preempt pod (UID: &{{{uid}}}) on "
                                         f"node: {name}, but the pod is not found on that node")
                found.pods.append(match)
            answer[str(name)] = found
        return answer

    def _prepare_candidate_async(self, key: str, pod: Obj, node: str, victims: list[Obj]) -> None:
        """Evaluator.prepareCandidateAsync: the preemptor is held (PreEnqueue) while a background task preempts the
        victims that are not already being deleted."""
        to_preempt = [v for v in victims if not (v.get("metadata") or {}).get("deletionTimestamp")]
        if not to_preempt:
            return
        with self.lock:
            self.preempting[key] = ""
        self.binder.submit(self._preempt_victims, key, pod, node, to_preempt)

    def _preempt_victims(self, key: str, pod: Obj, node: str, victims: list[Obj]) -> None:
        """The preemption goroutine: clear the lower-priority nominations on the node, preempt every victim but
        the last, register the last one, preempt it; on an error the preemptor is activated."""
        failed = False
        try:
            with self.lock:
                lower = [other for where, other in self.nominated.values()
                         if where == node and pod_priority(other) < pod_priority(pod)]
            for other in lower:  # clearNominatedNodeName (no APICacher: SchedulerAsyncAPICalls is off in 1.34)
                if not nominated_node_name(other):
                    continue
                try:
                    self.api.patch_status(other, {"status": {"nominatedNodeName": None}})
                except Exception as exc:
                    failed = True
                    log.info("cannot clear nominatedNodeName pod=%s error=%s", _pod_key(other), _short(exc))
            preempt_last = True
            for victim in victims[:-1]:
                try:
                    self._preempt_pod(pod, victim, node)
                except Exception as exc:
                    failed, preempt_last = True, False
                    log.info("preemption failed preemptor=%s victim=%s error=%s", key, _pod_key(victim), _short(exc))
                    break
            if preempt_last:
                with self.lock:
                    self.preempting[key] = _pod_key(victims[-1])
                try:
                    self._preempt_pod(pod, victims[-1], node)
                except Exception as exc:
                    failed = True
                    log.info("preemption failed preemptor=%s victim=%s error=%s", key, _pod_key(victims[-1]),
                             _short(exc))
        finally:
            with self.lock:
                self.preempting.pop(key, None)
                if failed:  # Activate: the pod could be stuck with the unschedulable ones
                    state = self.queue_state.get(key)
                    if state is not None and key not in self.in_flight:
                        state.unschedulable_since = 0.0
                        self._push(key, time.monotonic())

    def _preempt_pod(self, preemptor: Obj, victim: Obj, node: str) -> None:
        """Evaluator.PreemptPod: the DisruptionTarget condition through the status subresource, the deletion, the
        victim's `Preempted` event. A victim that is already gone is no error (and gets no event)."""
        scheduler = (preemptor.get("spec") or {}).get("schedulerName") or "default-scheduler"
        existing = next((c for c in (victim.get("status") or {}).get("conditions") or ()
                         if isinstance(c, dict) and c.get("type") == "DisruptionTarget"), None)
        condition = disruption_target_condition(scheduler, existing, now_rfc3339())
        if condition is not None:
            generation = (victim.get("metadata") or {}).get("generation")
            if isinstance(generation, int):
                condition["observedGeneration"] = generation  # PodObservedGenerationTracking (beta in 1.34)
            try:
                self.api.patch_status(victim, {"status": {"conditions": [condition]}})
            except Exception as exc:
                if _not_found(exc):
                    return
                raise
        try:
            self.api.delete_pod(victim)
        except Exception as exc:
            if _not_found(exc):
                return
            raise
        self._event(victim, "Normal", "Preempted", preempted_message(preemptor, node), action="Preempting",
                    related=preemptor)

    def _wait_for_claims(self, key: str, message: str) -> None:
        """PreEnqueue: the pod waits, without an event, until its claims exist (a claim or pod event moves it)."""
        with self.lock:
            self.in_flight.discard(key)
            state = self.queue_state.setdefault(key, _QueuedPod(first_seen=time.time()))
            state.last_message = message
            if self.cycle_seq.pop(key, self.flush_seq) != self.flush_seq:
                self._push(key, time.monotonic() + INITIAL_BACKOFF)
            else:
                state.unschedulable_since = time.monotonic()
        log.info("event=waiting_for_claims pod=%s message=%s", key, message)

    def _bind(self, key: str, pod: Obj, node: str, started: float, bind_sent: float,
              dra_state: PodDra | None = None) -> None:
        meta = pod.get("metadata") or {}
        binder = next((e for e in self.config.extenders if e.bind_verb and e.is_interested(pod)), None)
        error = ""
        try:
            if self.dra is not None and dra_state is not None:
                self.dra.pre_bind(pod, dra_state)
            if binder is not None:
                args = {"PodName": meta.get("name"), "PodNamespace": meta.get("namespace") or "default",
                        "PodUID": meta.get("uid"), "Node": node}
                result = self._post(binder, binder.bind_verb, args)
                error = str(_field(result, "Error") or "")
            else:
                self.api.bind(pod, node)
        except _ExtenderError as exc:
            error = str(exc)
        except DraBindError as exc:
            error = f'running PreBind plugin "DynamicResources": {exc}'
        except Exception as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        done = time.time()
        if self.dra is not None and dra_state is not None:
            if error:
                self.dra.unreserve(key, pod, dra_state)
            else:
                self.dra.forget(key)
        if error:
            self.stats["bind_failed"] += 1
            with self.lock:
                self.assumed.pop(key, None)
                self.in_flight.discard(key)
            self._fail(key, pod, "SchedulerError", f"Binding rejected: {error}", started, requeue_only=False,
                       nominating="")
            return
        self.stats["bound"] += 1
        with self.lock:
            state = self.queue_state.get(key)
            attempts = (state.attempts + 1) if state else 1
            self.in_flight.discard(key)
            # keep `assumed` until the informer shows spec.nodeName (as kube-scheduler's cache does)
            current = self.pods.get(key)
            if current is not None and (current.get("spec") or {}).get("nodeName"):
                self.assumed.pop(key, None)
            elif key in self.assumed:
                self.bound_at[key] = time.monotonic()
        self._record(ev="bound", pod=key, uid=meta.get("uid"), node=node, bind_sent=bind_sent, bind_done=done,
                     created=meta.get("creationTimestamp"), attempts=attempts,
                     cycle_ms=round((time.monotonic() - started) * 1000, 3))
        self._event(pod, "Normal", "Scheduled", f"Successfully assigned {key} to {node}")

    # -- failures
    def _requeue_with_backoff(self, key: str, message: str) -> _QueuedPod:
        """Caller holds the lock."""
        state = self.queue_state.setdefault(key, _QueuedPod(first_seen=time.time()))
        state.attempts += 1
        delay = min(MAX_BACKOFF, INITIAL_BACKOFF * 2 ** (state.attempts - 1))
        state.backoff_until = time.monotonic() + delay
        state.unschedulable_since = time.monotonic()
        return state

    def _fail(self, key: str, pod: Obj, reason: str, message: str, started: float,
              requeue_only: bool = False, nominating: str | None = None) -> None:
        """handleSchedulingFailure: requeue, the nominator (AddNominatedPod), the FailedScheduling event, and one
        status patch with the PodScheduled condition and, when `nominating` (None: leave it; "": clear it; a node:
        nominate it) changes it, status.nominatedNodeName."""
        self.stats["failed_cycles"] += 1
        with self.lock:
            self.in_flight.discard(key)
            state = self._requeue_with_backoff(key, message)
            if reason == "SchedulerError" or self.cycle_seq.pop(key, self.flush_seq) != self.flush_seq:
                # errors (extender down, bind refused) are retried on backoff alone, not on cluster events;
                # so is a pod whose cycle missed an event that requeues unschedulable pods
                state.unschedulable_since = 0.0
                self._push(key, state.backoff_until)
            changed = state.last_message != message
            state.last_message = message
            current = self.pods.get(key)
            node = nominating if nominating is not None else nominated_node_name(current)
            if current is not None and self._wants(current) and node:
                self.nominated[key] = (node, current)
            else:
                self.nominated.pop(key, None)
        self._record(ev="failed", pod=key, uid=(pod.get("metadata") or {}).get("uid"), reason=reason,
                     message=message, attempts=state.attempts)
        log.info("FailedScheduling pod=%s reason=%s message=%s", key, reason, message)
        self._event(pod, "Warning", "FailedScheduling", message, state=state, repeat=not changed)
        status: Obj = {}
        if changed and not requeue_only:
            status["conditions"] = [{
                "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                "lastProbeTime": None, "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }]
        if nominating is not None and nominated_node_name(pod) != nominating:
            status["nominatedNodeName"] = nominating or None
        if status:
            try:
                self.api.patch_status(pod, {"status": status})
            except Exception as exc:
                log.info("condition patch failed pod=%s error=%s", key, _short(exc))

    def _event(self, pod: Obj, typ: str, reason: str, message: str, state: _QueuedPod | None = None,
               repeat: bool = False, action: str = "Scheduling", related: Obj | None = None) -> None:
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            if repeat and state is not None and state.event_name and state.event_count:
                state.event_count += 1
                self.api.patch_event(ns, state.event_name, {"count": state.event_count, "lastTimestamp": now})
                return
            name = f"{meta.get('name')}.{time.time_ns():x}"
            self.api.create_event(ns, {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "namespace": ns,
                                   "uid": meta.get("uid")},
                "reason": reason, "message": message, "type": typ, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now,
                "source": {"component": next(iter(sorted(self.names)), "default-scheduler")},
                "reportingComponent": "vgpu-scheduler-driver", "action": action,
                **({"related": {"apiVersion": "v1", "kind": "Pod", "name": (related.get("metadata") or {}).get("name"),
                                "namespace": (related.get("metadata") or {}).get("namespace") or "default",
                                "uid": (related.get("metadata") or {}).get("uid")}} if related else {}),
            })
            if state is not None:
                state.event_name, state.event_count = name, 1
        except Exception as exc:
            log.debug("event not recorded pod=%s error=%s", meta.get("name"), exc)

    # -- introspection for tests and the demo
    def pending_reasons(self) -> dict[str, str]:
        """Pod key -> last failure message, for pods still waiting."""
        with self.lock:
            return {key: state.last_message for key, state in self.queue_state.items() if state.last_message}


def _kubernetes_version(text: str) -> KubernetesVersion:
    """argparse type of --kubernetes-version."""
    try:
        return parse_kubernetes_version(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    """Command line entry: schedule until SIGTERM / SIGINT."""
    ap = argparse.ArgumentParser(prog="python -m vgpu.testbed.scheduler_driver",
                                 description="TEST INFRASTRUCTURE: kube-scheduler stand-in driving an extender")
    ap.add_argument("--config", default=None,
                    help="KubeSchedulerConfiguration file or ConfigMap manifest (default: found under deploy/)")
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--extender-url", default=None, help="override every extender's scheme://host:port")
    ap.add_argument("--trace", default=None, help="append one JSON line per bind / failure here")
    ap.add_argument("--unschedulable-flush", type=float, default=30.0,
                    help="seconds after which unschedulable pods are retried without a cluster event")
    ap.add_argument("--builtin-config", action="store_true", help="use the built-in copy (driver tests only)")
    ap.add_argument("--no-dra", action="store_true", help="leave ResourceClaims alone (no DynamicResources plugin)")
    ap.add_argument("--kubernetes-version", type=_kubernetes_version, metavar="MAJOR.MINOR",
                    default=".".join(str(part) for part in DEFAULT_KUBERNETES_VERSION),
                    help="answer DRA allocation as this kube-scheduler release does (1.34, 1.35 or 1.36; default "
                         "%(default)s)")
    ap.add_argument("--no-preemption", dest="preemption", action="store_false",
                    help="no PostFilter (DefaultPreemption runs by default, as in kube-scheduler's default profile)")
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        if args.builtin_config:
            config = parse_scheduler_config(BUILTIN_CONFIG, "<builtin>")
        else:
            path = args.config or find_deploy_config()
            if path is None:
                print("scheduler driver: no KubeSchedulerConfiguration under deploy/; pass --config", file=sys.stderr)
                return 2
            config = load_scheduler_config(path)
        if args.extender_url:
            config = config.with_extender_url(args.extender_url)
    except ConfigError as exc:
        print(f"scheduler driver: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    driver = SchedulerDriver(config, args.kubeconfig, trace=args.trace, unschedulable_flush=args.unschedulable_flush,
                             dra=not args.no_dra, kubernetes_version=args.kubernetes_version,
                             preemption=args.preemption)
    try:
        driver.start()
    except RuntimeError as exc:
        print(f"scheduler driver: {exc}", file=sys.stderr)
        return 1
    print(f"ready config={config.source} extenders={','.join(e.url_prefix for e in config.extenders)}", flush=True)
    stop.wait()
    driver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
