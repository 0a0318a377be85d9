"""TEST INFRASTRUCTURE: ValidatingAdmissionPolicy admission for the API-server stand-in, written from kube-apiserver's
own (staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating: dispatcher.go, validator.go; matching:
.../policy/generic/policy_matcher.go and .../webhook/predicates/rules/rules.go), with a real CEL implementation
(cel-expr-python, the Python binding of cel-cpp).  It imports nothing of the product.

What it does, as upstream does:
  * every stored ValidatingAdmissionPolicy is matched against the request by its matchConstraints (resourceRules:
    operations, apiGroups, apiVersions, resources with `res/sub`, `res/*`, `*` and `*/*`, resourceNames, scope;
    excludeResourceRules; objectSelector on the object or the old object; namespaceSelector on the namespace's
    labels, which are only `kubernetes.io/metadata.name`, since the stand-in serves no Namespace objects); then
    each ValidatingAdmissionPolicyBinding naming it, by its own matchResources (none: all the policy matches);
  * matchConditions, variables (in order; one that fails to evaluate is left out, so only expressions that use it
    fail, as upstream's lazy variables do), validations;
  * a validation that is false denies with its messageExpression (a non-empty one-line string), else its message,
    else "failed expression: <expression>", and its reason (Invalid when unset), whose HTTP code follows upstream's
    reasonToCode (policy_decision.go); an expression that fails to compile or evaluate denies under failurePolicy
    Fail (the default) and is ignored under Ignore; validationActions Deny denies, Warn and Audit only record; a
    policy without a binding does nothing;
  * the first denial answers as admission.NewForbidden does: `<resource> "<name>" is forbidden:
    ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`.
`request` is the AdmissionRequest as CEL sees it (empty fields left out), `object` / `oldObject` null where the
operation has none, `namespaceObject` the namespace's metadata.  Not done: type checking against OpenAPI schemas,
the cost budget, `params` (a policy with paramKind is a configuration error here), `authorizer`, auditAnnotations.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cel_expr_python import cel  # type: ignore[import-untyped]

__all__ = ["POLICY_PLURALS", "Attributes", "Denied", "PolicyAdmission", "UserInfo"]

Obj = dict[str, Any]

_ENV = cel.NewEnv(variables={name: cel.Type.DYN for name in
                             ("object", "oldObject", "request", "params", "namespaceObject", "variables")})
# metav1.StatusReason -> HTTP code, as policy_decision.go's reasonToCode (anything else: 422)
_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# the resource (plural) of each kind this admission reads, under admissionregistration.k8s.io/v1
POLICY_PLURALS = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                  "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}


@dataclass(frozen=True)
class UserInfo:
    """The authenticated user of a request, as kube-apiserver's authenticators give it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_cel(self) -> Obj:
        out: Obj = {"username": self.username}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


@dataclass(frozen=True)
class Attributes:
    """One request as admission sees it."""

    operation: str  # CREATE | UPDATE | DELETE
    group: str
    version: str
    resource: str  # plural
    subresource: str  # "" for the main resource
    kind: str  # of the object: Binding for pods/binding
    name: str
    namespace: str  # "" when cluster-scoped
    object: Obj | None
    old_object: Obj | None
    user: UserInfo
    dry_run: bool = False  # the request's dryRun=All

    def request(self) -> Obj:
        """`request` as kube-apiserver hands it to CEL (cel.CreateAdmissionRequest; empty fields left out)."""
        kind = {"group": self.group, "version": "v1" if self.kind == "Binding" else self.version, "kind": self.kind}
        if self.kind == "Binding":
            kind["group"] = ""
        resource = {"group": self.group, "version": self.version, "resource": self.resource}
        out: Obj = {"kind": kind, "requestKind": kind, "resource": resource, "requestResource": resource,
                    "operation": self.operation, "userInfo": self.user.as_cel(), "dryRun": self.dry_run}
        if self.subresource:
            out["subResource"] = out["requestSubResource"] = self.subresource
        if self.name:
            out["name"] = self.name
        if self.namespace:
            out["namespace"] = self.namespace
        return out


class Denied(Exception):
    """The request is refused; `status` is the metav1.Status kube-apiserver answers."""

    def __init__(self, code: int, status: Obj) -> None:
        super().__init__(status["message"])
        self.code = code
        self.status = status


class _ConfigError(Exception):
    pass


class _EvalError(Exception):
    pass


def _compile(expression: str) -> Any:
    try:
        return _ENV.compile(expression)
    except RuntimeError as exc:
        raise _ConfigError(f"compilation failed: {expression!r}: {exc}") from None


def _eval(program: Any, expression: str, data: Obj) -> Any:
    result = program.eval(data=data)
    if result.type() == cel.Type.ERROR:
        raise _EvalError(f"expression '{expression}' resulted in error: {result.value()}")
    return result.plain_value()


def _selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector: nil or empty selects everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise _ConfigError(f"{op!r} is not a valid label selector operator")
    return True


def _rule_matches(rule: Obj, a: Attributes) -> bool:
    """rules.go: operations, apiGroups, apiVersions, resources (with subresources), scope; plus resourceNames."""
    def listed(values: Iterable[str] | None, want: str) -> bool:
        return any(v in ("*", want) for v in values or ())

    if not (listed(rule.get("operations"), a.operation) and listed(rule.get("apiGroups"), a.group)
            and listed(rule.get("apiVersions"), a.version)):
        return False
    names = rule.get("resourceNames") or []
    if names and a.name not in names:
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and a.namespace) or (scope == "Namespaced" and not a.namespace):
        return False
    for entry in rule.get("resources") or ():
        if entry == "*/*":
            return True
        res, slash, sub = entry.partition("/")
        if res not in ("*", a.resource):
            continue
        if (not slash and not a.subresource) or (slash and sub in ("*", a.subresource)):
            return True
    return False


def _resources_match(match: Obj | None, a: Attributes) -> bool:
    """MatchResources: namespaceSelector, objectSelector, resourceRules (empty: all), excludeResourceRules."""
    match = match or {}
    if a.namespace and not _selector_matches(match.get("namespaceSelector"), {NAMESPACE_NAME_LABEL: a.namespace}):
        return False
    selector = match.get("objectSelector")
    if selector:
        labels = [((o.get("metadata") or {}).get("labels") or {}) for o in (a.object, a.old_object) if o]
        if not any(_selector_matches(selector, lab) for lab in labels):
            return False
    rules = match.get("resourceRules") or []
    if rules and not any(_rule_matches(r, a) for r in rules):
        return False
    return not any(_rule_matches(r, a) for r in match.get("excludeResourceRules") or [])


class _Compiled:
    """One policy's expressions, compiled (or the configuration error that stops it)."""

    def __init__(self, policy: Obj) -> None:
        spec = policy.get("spec") or {}
        self.error: str | None = None
        try:
            if spec.get("paramKind"):
                raise _ConfigError("paramKind is not supported by the API-server stand-in")
            self.conditions = [(c.get("name", ""), c["expression"], _compile(c["expression"]))
                               for c in spec.get("matchConditions") or []]
            self.variables = [(v["name"], v["expression"], _compile(v["expression"]))
                              for v in spec.get("variables") or []]
            self.validations = [(v, _compile(v["expression"]),
                                 _compile(v["messageExpression"]) if v.get("messageExpression") else None)
                                for v in spec.get("validations") or []]
        except (_ConfigError, KeyError, TypeError) as exc:
            self.error = str(exc)


@dataclass
class _Decision:
    message: str
    reason: str = "Invalid"


class PolicyAdmission:
    """Validates requests against the ValidatingAdmissionPolicies and bindings given to `validate`."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str], _Compiled] = {}
        self._lock = threading.Lock()
        self.warnings: list[str] = []  # Warn actions, newest last (kept for tests to read)

    def _program(self, policy: Obj) -> _Compiled:
        meta = policy.get("metadata") or {}
        key = (str(meta.get("uid") or meta.get("name")), str(meta.get("resourceVersion") or ""))
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compiled[key] = _Compiled(policy)
            return compiled

    def validate(self, policies: Iterable[Obj], bindings: Iterable[Obj], a: Attributes) -> None:
        """Raise Denied when a policy bound with validationActions Deny refuses the request."""
        by_policy: dict[str, list[Obj]] = {}
        for b in bindings:
            by_policy.setdefault((b.get("spec") or {}).get("policyName", ""), []).append(b)
        denials: list[tuple[str, str | None, _Decision]] = []
        for policy in sorted(policies, key=lambda p: p["metadata"]["name"]):
            spec = policy.get("spec") or {}
            fail = (spec.get("failurePolicy") or "Fail") != "Ignore"
            name = policy["metadata"]["name"]
            if name not in by_policy:
                continue  # a policy takes effect only through a binding
            try:
                if not _resources_match(spec.get("matchConstraints"), a):
                    continue
            except _ConfigError as exc:
                if fail:
                    denials.append((name, None, _Decision(f"failed to configure policy: {exc}")))
                continue
            compiled = self._program(policy)
            if compiled.error is not None:
                if fail:
                    denials.append((name, None, _Decision(f"failed to configure policy: {compiled.error}")))
                continue
            for binding in sorted(by_policy.get(name, ()), key=lambda b: b["metadata"]["name"]):
                bspec = binding.get("spec") or {}
                try:
                    if not _resources_match(bspec.get("matchResources"), a):
                        continue
                except _ConfigError as exc:
                    if fail:
                        denials.append((name, binding["metadata"]["name"],
                                        _Decision(f"failed to configure binding: {exc}")))
                    continue
                if bspec.get("paramRef"):
                    if fail:
                        denials.append((name, binding["metadata"]["name"], _Decision(
                            "failed to configure binding: paramRef is not supported by the API-server stand-in")))
                    continue
                for decision in self._evaluate(compiled, a, fail):
                    actions = bspec.get("validationActions") or []
                    if "Deny" in actions:
                        denials.append((name, binding["metadata"]["name"], decision))
                    if "Warn" in actions:
                        self.warnings.append(f"Validation failed for ValidatingAdmissionPolicy '{name}' with "
                                             f"binding '{binding['metadata']['name']}': {decision.message}")
        if denials:
            policy_name, binding_name, decision = denials[0]
            what = (f"ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: "
                    if binding_name else f"ValidatingAdmissionPolicy '{policy_name}' denied request: ")
            raise _forbidden(a, what + decision.message, decision.reason)

    def _evaluate(self, compiled: _Compiled, a: Attributes, fail: bool) -> list[_Decision]:
        """The denials of one policy for one request (validator.go)."""
        data: Obj = {"object": a.object, "oldObject": a.old_object, "request": a.request(), "params": None,
                     "namespaceObject": {"metadata": {"name": a.namespace, "labels": {
                         NAMESPACE_NAME_LABEL: a.namespace}}} if a.namespace else None,
                     "variables": {}}
        for vname, expression, program in compiled.variables:
            try:
                data["variables"] = {**data["variables"], vname: _eval(program, expression, data)}
            except _EvalError:
                continue  # only the expressions that use it fail
        for _, expression, program in compiled.conditions:
            try:
                if _eval(program, expression, data) is not True:
                    return []
            except _EvalError as exc:
                return [_Decision(str(exc))] if fail else []
        out = []
        for validation, program, message_program in compiled.validations:
            try:
                ok = _eval(program, validation["expression"], data)
            except _EvalError as exc:
                if fail:
                    out.append(_Decision(str(exc)))
                continue
            if ok is True:
                continue
            message = ""
            if message_program is not None:
                try:
                    value = _eval(message_program, validation["messageExpression"], data)
                    if isinstance(value, str) and "\n" not in value.strip():
                        message = value.strip()
                except _EvalError:
                    message = ""
            if not message:
                message = (validation.get("message") or "").strip()
            if not message:
                message = f"failed expression: {validation['expression'].strip()}"
            out.append(_Decision(message, validation.get("reason") or "Invalid"))
        return out


def _forbidden(a: Attributes, message: str, reason: str) -> Denied:
    """admission.NewForbidden with the decision's reason and code (dispatcher.go)."""
    name = a.name
    if not name and a.object:
        meta = a.object.get("metadata") or {}
        name = meta.get("name") or (meta.get("generateName", "") + "*" if meta.get("generateName") else "")
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    text = f'{qualified} "{name}" is forbidden: {message}'
    code = _CODES.get(reason, 422)
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": text,
              "reason": reason, "details": {"name": name, "group": a.group, "kind": a.resource,
                                            "causes": [{"message": message}]}, "code": code}
    return Denied(code, status)
