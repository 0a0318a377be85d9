"""TEST INFRASTRUCTURE: kube-scheduler's structured-parameters allocator for DRA (`resource.k8s.io/v1`), as a stand-in.

Written from upstream's documented behaviour (k8s.io/dynamic-resource-allocation/structured), sharing nothing with
the DRA code it tests. For one node it answers whether a set of unallocated ResourceClaims can all be allocated,
and with which devices:

  * pools: slices whose `nodeName` is the node, `allNodes`, a `nodeSelector` matching the node, or
    `perDeviceNodeSelection` (then per device); per (driver, pool) only the slices of the newest generation count;
    a pool with fewer slices than `resourceSliceCount` is incomplete (refused for allocationMode All), one with a
    device name twice is invalid (an error once the search reaches it);
  * search: claims in order, their requests in order, one device after the other; candidates are the pools (by
    driver, then pool name), their slices (by name), their devices in slice order; the first complete solution
    wins, a dead end backtracks to the next candidate; `firstAvailable` alternatives are tried in order;
  * a candidate must match the DeviceClass selectors and the request selectors (CEL over `device.driver`,
    `device.attributes["<domain>"].<name>`, `device.capacity["<domain>"].<name>`,
    `device.allowMultipleAllocations`), must not be in use (a device without allowMultipleAllocations is taken
    whole by one claim), must satisfy the claim's constraints (matchAttribute, distinctAttribute) and must have
    room for the request's capacity;
  * consumable capacity: for every capacity of the device, the amount consumed is the request's amount rounded up
    per the capacity's requestPolicy (validRange: min, then min + k * step; validValues: the next listed value), or
    the policy's default when the request names none, or the whole capacity without a policy; the device fits
    while what allocated claims consumed plus this stays within the capacity and the amount obeys the policy.
    A device that allows multiple allocations gets a fresh `shareID` and `consumedCapacity` in the result.

Kubernetes version (`kubernetes_version`, (major, minor), 1.34 to 1.36, default 1.36): with DRAConsumableCapacity
on, 1.34 and 1.35 run upstream's `internal/experimental` allocator, 1.36 its `internal/incubating` one, and they
differ in how one ExactCount request picks its devices:

  * 1.34, 1.35: every pick of a request scans all candidates again; a device that allows multiple allocations is
    never marked in use by an allocation in flight, so one request with `count: 2` may take the same shared
    device twice (two results, two shareIDs, its capacity consumed twice);
  * 1.36: the next pick of the same request only looks at candidates after the previous pick (combinations
    instead of permutations, kubernetes/kubernetes#133678), so one request takes distinct devices; other
    requests and claims still start from the first candidate and may share a device with it.

A broken class or claim (CEL that does not compile, fails at run time or is not boolean, unknown capacity spelled
twice, an invalid pool) raises AllocationError: upstream aborts the scheduling attempt with that error.
"""

from __future__ import annotations

import functools
import math
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

__all__ = [
    "DEFAULT_KUBERNETES_VERSION",
    "SUPPORTED_KUBERNETES_VERSIONS",
    "AllocatedState",
    "AllocationError",
    "Allocator",
    "KubernetesVersion",
    "Quantity",
    "SelectorCache",
    "node_selector_matches",
    "parse_kubernetes_version",
    "parse_quantity",
]

Obj = dict[str, Any]
DeviceId = tuple[str, str, str]  # driver, pool, device

ALLOCATION_RESULTS_MAX_SIZE = 32  # resource.k8s.io/v1 AllocationResultsMaxSize

KubernetesVersion = tuple[int, int]  # (major, minor)
SUPPORTED_KUBERNETES_VERSIONS: tuple[KubernetesVersion, ...] = ((1, 34), (1, 35), (1, 36))
DEFAULT_KUBERNETES_VERSION: KubernetesVersion = SUPPORTED_KUBERNETES_VERSIONS[-1]
# since this minor, the picks of one request are combinations of distinct devices (see the module docstring)
_DISTINCT_PICKS_SINCE: KubernetesVersion = (1, 36)


def parse_kubernetes_version(text: str | KubernetesVersion) -> KubernetesVersion:
    """(major, minor) of "1.35", "v1.35", "1.35.2" (the patch level is ignored) or of a pair, checked against the
    versions this stand-in models; ValueError otherwise."""
    if isinstance(text, tuple):
        version = (int(text[0]), int(text[1])) if len(text) == 2 else (0, 0)
    else:
        match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", str(text).strip())
        if match is None:
            raise ValueError(f"Kubernetes version {text!r}: expected MAJOR.MINOR, e.g. 1.36")
        version = (int(match.group(1)), int(match.group(2)))
    if version not in SUPPORTED_KUBERNETES_VERSIONS:
        known = ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED_KUBERNETES_VERSIONS)
        raise ValueError(f"Kubernetes version {text!r}: the allocator stand-in models {known}")
    return version


class AllocationError(Exception):
    """A claim, class or slice the allocator cannot work with; the scheduling attempt stops with this message."""


# ------------------------------------------------------------------------------------------------ quantities

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}
_QUANTITY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?\d+))?$")


@dataclass(frozen=True, slots=True)
class Quantity:
    """A resource.Quantity: an exact value and whether it prints with binary (Ki, Mi, ...) suffixes."""

    value: Fraction
    binary: bool = False

    def __str__(self) -> str:
        """The canonical form, as apimachinery serialises a Quantity."""
        v = self.value
        if v == 0:
            return "0"
        if self.binary and v.denominator == 1 and abs(v) >= 1024:
            n, power = int(v), 0
            while power < 6 and n % 1024 == 0:
                n, power = n // 1024, power + 1
            if power:
                return f"{n}{next(s for s, p in _BINARY.items() if p == power)}"
            return str(int(v))
        for exp in range(18, -12, -3):
            mantissa = v / Fraction(10) ** exp
            if mantissa.denominator == 1:
                return f"{mantissa.numerator}{_DECIMAL_SUFFIX[exp]}"
        nanos = math.ceil(v * 10**9)  # finer than nano: rounded up, as apimachinery does
        return str(Quantity(Fraction(nanos, 10**9)))


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: Any) -> Quantity:
    """Parse a Kubernetes quantity ("40Gi", "100", "500m", "1e3"); ValueError when it is not one."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"quantity {text!r}: not a string")
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"quantity {text!r}: not a Kubernetes quantity")
    sign, number, suffix, exponent = match.groups()
    value = Fraction(number)
    binary = False
    if suffix in _BINARY:
        value *= 1024 ** _BINARY[suffix]
        binary = True
    elif suffix is not None:
        value *= Fraction(10) ** _DECIMAL[suffix]
    elif exponent is not None:
        value *= Fraction(10) ** int(exponent)
    return Quantity(-value if sign == "-" else value, binary)


# ------------------------------------------------------------------------------------------------ node selection

def _requirement_matches(req: Obj, values_of: Callable[[str], str | None]) -> bool:
    have = values_of(str(req.get("key") or ""))
    op, values = req.get("operator"), [str(v) for v in req.get("values") or ()]
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(values) == 1:
        try:
            left, right = int(have), int(values[0])
        except ValueError:
            return False
        return left > right if op == "Gt" else left < right
    return False


def node_selector_matches(selector: Obj | None, node: Obj) -> bool:
    """A core/v1 NodeSelector: any term matches when all its matchExpressions (labels) and matchFields do."""
    if not selector:
        return True
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    fields = {"metadata.name": meta.get("name")}
    for term in selector.get("nodeSelectorTerms") or ():
        exprs, flds = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not flds:
            continue  # an empty term matches nothing
        if all(_requirement_matches(r, labels.get) for r in exprs) and \
                all(_requirement_matches(r, fields.get) for r in flds):
            return True
    return False


def _placement_matches(spec: Obj, node: Obj) -> bool:
    name = (node.get("metadata") or {}).get("name")
    if spec.get("nodeName"):
        return bool(spec["nodeName"] == name)
    if spec.get("allNodes"):
        return True
    if spec.get("nodeSelector"):
        return node_selector_matches(spec["nodeSelector"], node)
    return False


@dataclass(slots=True)
class _Pool:
    driver: str
    name: str
    slices: list[Obj]
    incomplete: bool
    invalid: str = ""


def _gather_pools(slices: list[Obj], node: Obj) -> list[_Pool]:
    """The pools with devices usable on `node`, newest generation only, by driver then pool name."""
    by_pool: dict[tuple[str, str], list[Obj]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if not (spec.get("perDeviceNodeSelection") or _placement_matches(spec, node)):
            continue
        pool = spec.get("pool") or {}
        by_pool.setdefault((str(spec.get("driver")), str(pool.get("name"))), []).append(s)
    pools = []
    for (driver, name), members in sorted(by_pool.items()):
        newest = max(int(((m.get("spec") or {}).get("pool") or {}).get("generation") or 0) for m in members)
        current = sorted((m for m in members
                          if int(((m.get("spec") or {}).get("pool") or {}).get("generation") or 0) == newest),
                         key=lambda m: str((m.get("metadata") or {}).get("name")))
        wanted = max(int(((m.get("spec") or {}).get("pool") or {}).get("resourceSliceCount") or 1) for m in current)
        pool = _Pool(driver, name, current, incomplete=len(current) < wanted)
        seen: set[str] = set()
        for m in current:
            for device in (m.get("spec") or {}).get("devices") or ():
                if device.get("name") in seen:
                    pool.invalid = f"duplicate device name {device.get('name')}"
                seen.add(device.get("name"))
        pools.append(pool)
    return pools


# ------------------------------------------------------------------------------------------------ CEL selectors

def _cel_quantity(text: str) -> str:
    return str(parse_quantity(text))


def _cel_compare(left: str, right: str) -> int:
    a, b = parse_quantity(left).value, parse_quantity(right).value
    return (a > b) - (a < b)


class SelectorCache:
    """Compiled CEL selectors (cel-expr-python), with the Kubernetes `quantity` helpers a selector may call.

    A quantity is handed to CEL as its canonical string; `quantity("1Gi")`, `q.compareTo(other)`,
    `q.isGreaterThan(other)`, `q.isLessThan(other)`, `q.asInteger()` and `q.asApproximateFloat()` work on those.
    Attribute values become CEL int / bool / string (versions as strings).
    """

    def __init__(self) -> None:
        from cel_expr_python import cel  # type: ignore[import-untyped]

        t = cel.Type
        self._cel = cel
        overloads = [
            ("quantity", "quantity_string", t.STRING, [t.STRING], False, _cel_quantity),
            ("compareTo", "quantity_compareTo", t.INT, [t.STRING, t.STRING], True, _cel_compare),
            ("isGreaterThan", "quantity_isGreaterThan", t.BOOL, [t.STRING, t.STRING], True,
             lambda a, b: _cel_compare(a, b) > 0),
            ("isLessThan", "quantity_isLessThan", t.BOOL, [t.STRING, t.STRING], True,
             lambda a, b: _cel_compare(a, b) < 0),
            ("asInteger", "quantity_asInteger", t.INT, [t.STRING], True,
             lambda a: int(parse_quantity(a).value)),
            ("asApproximateFloat", "quantity_asApproximateFloat", t.DOUBLE, [t.STRING], True,
             lambda a: float(parse_quantity(a).value)),
        ]
        functions = [cel.FunctionDecl(name, [cel.Overload(oid, ret, params, is_member=member, impl=impl)])
                     for name, oid, ret, params, member, impl in overloads]
        self._env = cel.NewEnv(variables={"device": t.DYN}, functions=functions)
        self._compiled: dict[str, tuple[Any, frozenset[str], str]] = {}

    def _compile(self, expression: str) -> tuple[Any, frozenset[str], str]:
        found = self._compiled.get(expression)
        if found is None:
            try:
                program, error = self._env.compile(expression), ""
            except RuntimeError as exc:
                program, error = None, str(exc).splitlines()[0]
            # domains the expression names: present as empty maps when the device has nothing there, as upstream
            domains = frozenset(re.findall(r"""(?:attributes|capacity)\s*\[\s*["']([^"']+)["']\s*\]""", expression))
            found = self._compiled[expression] = (program, domains, error)
        return found

    def matches(self, expression: str, driver: str, device: Obj) -> bool:
        """Evaluate one selector for a device of `driver`; AllocationError on compile or run-time errors."""
        program, domains, error = self._compile(expression)
        if program is None:
            raise AllocationError(f"CEL compile error: {error}")
        result = program.eval(data={"device": _cel_device(driver, device, domains)})
        if result.type() == self._cel.Type.ERROR:
            raise AllocationError(f"CEL runtime error: {result.value()}")
        value = result.plain_value()
        if not isinstance(value, bool):
            raise AllocationError(f"CEL runtime error: expression must evaluate to bool, got {value!r}")
        return value


def _split_name(name: str, driver: str) -> tuple[str, str]:
    domain, _, ident = name.rpartition("/")
    return (domain or driver), ident


def _attribute_value(attr: Any) -> Any:
    if isinstance(attr, dict):
        for key in ("int", "bool", "string", "version"):
            if key in attr:
                return attr[key]
    return None


def _cel_device(driver: str, device: Obj, domains: frozenset[str]) -> Obj:
    attributes: dict[str, Obj] = {d: {} for d in domains | {driver}}
    for name, attr in (device.get("attributes") or {}).items():
        domain, ident = _split_name(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(attr)
    capacity: dict[str, Obj] = {d: {} for d in domains | {driver}}
    for name, cap in (device.get("capacity") or {}).items():
        domain, ident = _split_name(name, driver)
        try:
            capacity.setdefault(domain, {})[ident] = str(parse_quantity((cap or {}).get("value")))
        except ValueError:
            raise AllocationError(f"device {device.get('name')}: capacity {name}: not a quantity") from None
    return {"driver": driver, "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
            "attributes": attributes, "capacity": capacity}


# ------------------------------------------------------------------------------------------------ consumable capacity

def _qualified(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _device_capacity(driver: str, device: Obj) -> dict[str, tuple[str, Obj]]:
    """Fully-qualified capacity name -> (name as published, capacity entry); the driver-qualified spelling wins."""
    out: dict[str, tuple[str, Obj]] = {}
    caps = device.get("capacity") or {}
    for name in sorted(caps, key=lambda n: not n.startswith(driver + "/")):
        out.setdefault(_qualified(name, driver), (name, caps[name] or {}))
    return out


def _quantity(value: Any, where: str) -> Quantity:
    try:
        return parse_quantity(value)
    except ValueError as exc:
        raise AllocationError(f"{where}: {exc}") from None


def _consumed_amount(requested: Quantity | None, cap: Obj, where: str) -> Quantity:
    """What one allocation consumes of a capacity: requestPolicy rounding, default, or the whole capacity."""
    policy = cap.get("requestPolicy")
    if requested is None:
        if policy and policy.get("default") not in (None, ""):
            return _quantity(policy["default"], f"{where}.requestPolicy.default")
        return _quantity(cap.get("value"), f"{where}.value")
    if not policy:
        return requested
    valid_range = policy.get("validRange")
    if valid_range and valid_range.get("min") not in (None, ""):
        low = _quantity(valid_range["min"], f"{where}.requestPolicy.validRange.min")
        if requested.value < low.value:
            return low
        if valid_range.get("step") in (None, ""):
            return requested
        step = _quantity(valid_range["step"], f"{where}.requestPolicy.validRange.step")
        if step.value <= 0:
            raise AllocationError(f"{where}.requestPolicy.validRange.step: must be positive")
        steps = math.ceil((requested.value - low.value) / step.value)
        return Quantity(low.value + steps * step.value, step.binary)
    if policy.get("validValues"):
        for raw in policy["validValues"]:
            candidate = _quantity(raw, f"{where}.requestPolicy.validValues")
            if requested.value <= candidate.value:
                return candidate
    return requested


def _violates_policy(amount: Quantity, cap: Obj, where: str) -> bool:
    policy = cap.get("requestPolicy")
    if not policy:
        return False
    if policy.get("default") not in (None, "") and \
            amount.value == _quantity(policy["default"], f"{where}.requestPolicy.default").value:
        return False
    valid_range = policy.get("validRange")
    if valid_range:
        if valid_range.get("max") not in (None, "") and \
                amount.value > _quantity(valid_range["max"], f"{where}.requestPolicy.validRange.max").value:
            return True
        if valid_range.get("step") not in (None, "") and valid_range.get("min") not in (None, ""):
            low = _quantity(valid_range["min"], where).value
            step = _quantity(valid_range["step"], where).value
            return (amount.value - low) % step != 0
        return False
    if policy.get("validValues"):
        return all(amount.value != _quantity(v, where).value for v in policy["validValues"])
    return False


@dataclass(slots=True)
class AllocatedState:
    """What allocated claims already hold: devices taken whole, and capacity consumed on shared devices."""

    exclusive: set[DeviceId] = field(default_factory=set)
    consumed: dict[DeviceId, dict[str, Fraction]] = field(default_factory=dict)  # fully-qualified capacity names

    @classmethod
    def of(cls, claims: list[Obj]) -> AllocatedState:
        """Sum up status.allocation of `claims` (results with a shareID consume capacity, others the device)."""
        state = cls()
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or ():
                if result.get("adminAccess"):
                    continue
                driver = str(result.get("driver"))
                device_id = (driver, str(result.get("pool")), str(result.get("device")))
                if not result.get("shareID"):
                    state.exclusive.add(device_id)
                    continue
                table = state.consumed.setdefault(device_id, {})
                for name, value in (result.get("consumedCapacity") or {}).items():
                    qualified = _qualified(name, driver)
                    try:
                        amount = parse_quantity(value).value
                    except ValueError:
                        continue  # a malformed stored amount cannot be counted; the API validates these
                    table[qualified] = table.get(qualified, Fraction(0)) + amount
        return state


# ------------------------------------------------------------------------------------------------ the search

@dataclass(slots=True)
class _Candidate:
    pool: _Pool
    slice: Obj
    device: Obj

    @property
    def id(self) -> DeviceId:
        return (self.pool.driver, self.pool.name, str(self.device.get("name")))


@dataclass(slots=True)
class _Request:
    claim_index: int
    name: str  # as written in results: "<request>" or "<request>/<subrequest>"
    base: str  # the request's own name (constraints refer to it)
    sub: str
    spec: Obj  # the `exactly` or subrequest body
    klass: Obj
    count: int
    all_devices: list[_Candidate] | None = None


@dataclass(slots=True)
class _Constraint:
    requests: frozenset[str]
    attribute: str
    distinct: bool
    values: list[Any] = field(default_factory=list)

    def applies(self, base: str, sub: str) -> bool:
        return not self.requests or base in self.requests or (bool(sub) and f"{base}/{sub}" in self.requests)


def _lookup_attribute(device: Obj, driver: str, name: str) -> Any:
    attrs = device.get("attributes") or {}
    if name in attrs:
        return attrs[name]
    domain, _, ident = name.partition("/")
    if domain == driver and ident in attrs:
        return attrs[ident]
    return None


class Allocator:
    """One allocation attempt for the unallocated claims of a pod, against the cluster's slices and usage."""

    def __init__(self, claims: list[Obj], state: AllocatedState, classes: dict[str, Obj], slices: list[Obj],
                 selectors: SelectorCache, kubernetes_version: KubernetesVersion = DEFAULT_KUBERNETES_VERSION) -> None:
        self.claims = claims
        self.state = state
        self.classes = classes
        self.slices = slices
        self.selectors = selectors
        self.kubernetes_version = parse_kubernetes_version(kubernetes_version)
        # 1.36+: a request's next pick starts after its previous one, so one request never repeats a device
        self.distinct_picks = self.kubernetes_version >= _DISTINCT_PICKS_SINCE

    # -- per node
    def allocate(self, node: Obj) -> list[Obj] | None:
        """Allocation results (one per claim, without allocationTimestamp) on `node`, or None if they do not fit."""
        run = _Run(self, node)
        return run.solve()


class _Run:
    """The state of one Allocator.allocate call (the backtracking search)."""

    def __init__(self, owner: Allocator, node: Obj) -> None:
        self.owner = owner
        self.node = node
        self.node_name = str((node.get("metadata") or {}).get("name"))
        self.pools = _gather_pools(owner.slices, node)
        self.taking: dict[DeviceId, set[int]] = {}  # devices taken whole in this attempt -> claim indices
        self.consuming: dict[DeviceId, dict[str, Fraction]] = {}
        self.results: list[list[Obj]] = [[] for _ in owner.claims]
        self.slices_used: list[list[Obj]] = [[] for _ in owner.claims]
        self.constraints: list[list[_Constraint]] = []
        self.requests: list[list[list[_Request]]] = []  # claim -> request -> alternatives
        self.match_cache: dict[tuple[DeviceId, int, str], bool] = {}

    # -- setup
    def _claim_name(self, index: int) -> str:
        meta = self.owner.claims[index].get("metadata") or {}
        return f"{meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('generateName') or '?'}"

    def _prepare(self) -> None:
        for ci, claim in enumerate(self.owner.claims):
            devices = (claim.get("spec") or {}).get("devices") or {}
            per_request = []
            for request in devices.get("requests") or ():
                base = str(request.get("name"))
                if request.get("firstAvailable"):
                    alternatives = [(f"{base}/{sub.get('name')}", str(sub.get("name")), sub)
                                    for sub in request["firstAvailable"]]
                else:
                    alternatives = [(base, "", request.get("exactly") or {})]
                per_request.append([self._request(ci, name, base, sub, body) for name, sub, body in alternatives])
            self.requests.append(per_request)
            constraints = []
            for i, c in enumerate(devices.get("constraints") or ()):
                attribute = c.get("matchAttribute") or c.get("distinctAttribute")
                if not attribute:
                    raise AllocationError(f"claim {self._claim_name(ci)}, constraint #{i}: empty constraint "
                                          f"(unsupported constraint type?)")
                constraints.append(_Constraint(frozenset(c.get("requests") or ()), str(attribute),
                                               distinct=not c.get("matchAttribute")))
            self.constraints.append(constraints)

    def _request(self, ci: int, name: str, base: str, sub: str, body: Obj) -> _Request:
        class_name = str(body.get("deviceClassName") or "")
        klass = self.owner.classes.get(class_name)
        if klass is None:
            raise AllocationError(f"request {name}: could not retrieve device class {class_name}")
        mode = body.get("allocationMode") or "ExactCount"
        req = _Request(ci, name, base, sub, body, klass, int(body.get("count") or 1))
        if mode == "All":
            devices: list[_Candidate] = []
            for pool in self.pools:
                if pool.incomplete:
                    raise AllocationError(f"claim {self._claim_name(ci)}, request {name}: asks for all devices, "
                                          f"but resource pool {pool.driver}/{pool.name} is currently being updated")
                if pool.invalid:
                    raise AllocationError(f"pool {pool.name} is invalid: {pool.invalid}")
                devices.extend(c for c in self._candidates_of(pool) if self._selectable(req, c))
            req.all_devices, req.count = devices, len(devices)
        elif mode != "ExactCount":
            raise AllocationError(f"claim {self._claim_name(ci)}, request {name}: unsupported allocation mode {mode}")
        return req

    def _candidates_of(self, pool: _Pool) -> Iterator[_Candidate]:
        for s in pool.slices:
            spec = s.get("spec") or {}
            for device in spec.get("devices") or ():
                if spec.get("perDeviceNodeSelection") and not _placement_matches(device, self.node):
                    continue
                yield _Candidate(pool, s, device)

    # -- checks
    def _selectable(self, req: _Request, cand: _Candidate) -> bool:
        key = (cand.id, req.claim_index, req.name)
        found = self.match_cache.get(key)
        if found is not None:
            return found
        ok = True
        for source, selectors in (("class " + str((req.klass.get("metadata") or {}).get("name")),
                                   (req.klass.get("spec") or {}).get("selectors") or ()),
                                  ("claim " + self._claim_name(req.claim_index), req.spec.get("selectors") or ())):
            for i, selector in enumerate(selectors):
                expression = str(((selector or {}).get("cel") or {}).get("expression") or "")
                try:
                    if not self.owner.selectors.matches(expression, cand.pool.driver, cand.device):
                        ok = False
                except AllocationError as exc:
                    raise AllocationError(f"{source}: selector #{i}: {exc}") from None
                if not ok:
                    break
            if not ok:
                break
        self.match_cache[key] = ok
        return ok

    def _in_use(self, device_id: DeviceId) -> bool:
        return device_id in self.owner.state.exclusive or bool(self.taking.get(device_id))

    def _capacity_fit(self, req: _Request, cand: _Candidate) -> dict[str, Quantity] | None:
        """Consumed amount per published capacity name if the request fits the device, else None."""
        driver = cand.pool.driver
        where = f"device {cand.id[2]} capacity"
        capacity = _device_capacity(driver, cand.device)
        requested: dict[str, Quantity] = {}
        for name, value in ((req.spec.get("capacity") or {}).get("requests") or {}).items():
            qualified = _qualified(str(name), driver)
            if qualified not in capacity:
                return None  # this device does not have what is asked for; another one may
            if qualified in requested:
                raise AllocationError(f"capacity {qualified} requested twice")
            requested[qualified] = _quantity(value, f"request {req.name} capacity {name}")
        used = self.owner.state.consumed.get(cand.id, {})
        pending = self.consuming.get(cand.id, {})
        consumed: dict[str, Quantity] = {}
        for qualified, (published, cap) in capacity.items():
            amount = _consumed_amount(requested.get(qualified), cap, f"{where} {published}")
            if amount.value < 0:
                raise AllocationError(f"{where} {published}: capacity value is negative")
            if _violates_policy(amount, cap, f"{where} {published}"):
                return None
            total = _quantity(cap.get("value"), f"{where} {published}.value").value
            if used.get(qualified, Fraction(0)) + pending.get(qualified, Fraction(0)) + amount.value > total:
                return None
            consumed[published] = amount
        return consumed

    # -- the recursion
    def solve(self) -> list[Obj] | None:
        self._prepare()
        if not self._allocate(0, 0, 0):
            return None
        out = []
        for ci, claim in enumerate(self.owner.claims):
            allocation: Obj = {"devices": {"results": self.results[ci]}}
            config = self._config(ci, claim)
            if config:
                allocation["devices"]["config"] = config
            selector = self._node_selector(ci)
            if selector is not None:
                allocation["nodeSelector"] = selector
            out.append(allocation)
        return out

    def _allocate(self, ci: int, ri: int, di: int, alternative: int = -1, start: int = 0) -> bool:
        """Pick device `di` of request `ri` (alternative `alternative`) of claim `ci`, then everything after it.
        `start` is the first candidate position (over all pools, slices and devices) this pick may use: 0 except
        for the next pick of the same request with distinct_picks (1.36+)."""
        if ci >= len(self.owner.claims):
            return True
        if ri >= len(self.requests[ci]):
            return self._allocate(ci + 1, 0, 0)
        alternatives = self.requests[ci][ri]
        if alternative < 0:
            # firstAvailable: the first alternative that leads to a full solution wins
            return any(self._allocate(ci, ri, 0, a) for a in range(len(alternatives)))
        req = alternatives[alternative]
        if req.all_devices is not None and not req.all_devices:
            return False
        if di >= req.count:
            return self._allocate(ci, ri + 1, 0)
        if len(self.results[ci]) + req.count - di > ALLOCATION_RESULTS_MAX_SIZE:
            return False
        if req.all_devices is not None:
            undo = self._take(req, req.all_devices[di])
            if undo is None:
                return False
            if self._allocate(ci, ri, di + 1, alternative):
                return True
            undo()
            return False
        position = -1
        for pool in self.pools:
            if pool.invalid:
                raise AllocationError(f"pool {pool.name} is invalid: {pool.invalid}")
            for cand in self._candidates_of(pool):
                position += 1
                if position < start or self._in_use(cand.id) or not self._selectable(req, cand):
                    continue
                undo = self._take(req, cand)
                if undo is None:
                    continue
                after = position + 1 if self.owner.distinct_picks else 0
                if self._allocate(ci, ri, di + 1, alternative, after):
                    return True
                undo()
        return False

    def _take(self, req: _Request, cand: _Candidate) -> Callable[[], None] | None:
        """Tentatively allocate `cand` for `req`; an undo function, or None when it cannot be taken."""
        ci = req.claim_index
        shared = bool(cand.device.get("allowMultipleAllocations"))
        if self._in_use(cand.id):
            return None
        added: list[_Constraint] = []
        for constraint in self.constraints[ci]:
            if not constraint.applies(req.base, req.sub):
                continue
            value = _lookup_attribute(cand.device, cand.pool.driver, constraint.attribute)
            ok = value is not None and (value not in constraint.values if constraint.distinct
                                        else not constraint.values or value == constraint.values[0])
            if not ok:
                for c in added:
                    c.values.pop()
                return None
            constraint.values.append(value)
            added.append(constraint)
        consumed = self._capacity_fit(req, cand)
        if consumed is None:
            for c in added:
                c.values.pop()
            return None
        result: Obj = {"request": req.name, "driver": cand.pool.driver, "pool": cand.pool.name,
                       "device": cand.id[2]}
        if req.spec.get("adminAccess"):
            result["adminAccess"] = True
        if req.spec.get("tolerations"):
            result["tolerations"] = req.spec["tolerations"]
        driver = cand.pool.driver
        if shared:
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {name: str(q) for name, q in consumed.items()}
            pending = self.consuming.setdefault(cand.id, {})
            for name, q in consumed.items():
                qualified = _qualified(name, driver)
                pending[qualified] = pending.get(qualified, Fraction(0)) + q.value
        else:
            self.taking.setdefault(cand.id, set()).add(ci)
        self.results[ci].append(result)
        self.slices_used[ci].append(cand.slice)

        def undo() -> None:
            for c in added:
                c.values.pop()
            if shared:
                pending = self.consuming[cand.id]
                for name, q in consumed.items():
                    pending[_qualified(name, driver)] -= q.value
            else:
                self.taking[cand.id].discard(ci)
            self.results[ci].pop()
            self.slices_used[ci].pop()

        return undo

    # -- the result
    def _config(self, ci: int, claim: Obj) -> list[Obj]:
        config: list[Obj] = []
        by_class: dict[str, list[str]] = {}
        for alternatives in self.requests[ci]:
            chosen = {r["request"] for r in self.results[ci]}
            for req in alternatives:
                if req.name in chosen:
                    by_class.setdefault(str((req.klass.get("metadata") or {}).get("name")), []).append(req.name)
        for class_name, names in by_class.items():
            for entry in ((self.owner.classes[class_name].get("spec") or {}).get("config") or ()):
                config.append({"source": "FromClass", "requests": names, **entry})
        for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or ():
            config.append({"source": "FromClaim", **entry})
        return config

    def _node_selector(self, ci: int) -> Obj | None:
        expressions: list[Obj] = []
        fields: list[Obj] = []
        for s, result in zip(self.slices_used[ci], self.results[ci]):
            spec = s.get("spec") or {}
            placement: Obj = spec
            if spec.get("perDeviceNodeSelection"):
                placement = next((d for d in spec.get("devices") or () if d.get("name") == result["device"]), {})
            device: Obj = next((d for d in spec.get("devices") or () if d.get("name") == result["device"]), {})
            if placement.get("nodeName") or device.get("bindsToNode"):
                return {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [self.node_name]}]}]}
            terms = (placement.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
            if len(terms) > 1:
                raise AllocationError(f"unsupported ResourceSlice.NodeSelector with {len(terms)} terms")
            if terms:
                for req in terms[0].get("matchFields") or ():
                    if req not in fields:
                        fields.append(req)
                for req in terms[0].get("matchExpressions") or ():
                    if req not in expressions:
                        expressions.append(req)
        if not expressions and not fields:
            return None
        term: Obj = {}
        if expressions:
            term["matchExpressions"] = expressions
        if fields:
            term["matchFields"] = fields
        return {"nodeSelectorTerms": [term]}
