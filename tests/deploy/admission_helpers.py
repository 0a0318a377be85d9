"""The ValidatingAdmissionPolicies of deploy/admission/, evaluated the way kube-apiserver evaluates them, with a real
CEL implementation (cel-expr-python, the Python binding of cel-cpp).

A request is matched against the policy's matchConstraints (group, version, operation, resource/subresource), then
its matchConditions, variables (in order) and validations are evaluated. `request` is built as kube-apiserver
builds it from its AdmissionRequest: fields that are empty are left out (`subResource`, `userInfo.extra`), so an
expression must guard them with has() there as well. A CEL error denies, as failurePolicy Fail does.
Expressions are compiled with every variable dynamic: kube-apiserver additionally type-checks them against the
OpenAPI schemas, which this cannot do.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from cel_expr_python import cel
from deploy_helpers import load_manifests

SERVICE_ACCOUNT = "system:serviceaccount:vgpu-system:{}"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
KINDS = {"pods": "Pod", "pods/status": "Pod", "pods/binding": "Binding", "nodes": "Node"}

_ENV = cel.NewEnv(variables={name: cel.Type.DYN for name in
                             ("object", "oldObject", "request", "params", "namespaceObject", "variables")})


class CELError(Exception):
    """An expression failed to compile or evaluate."""


@dataclass(frozen=True)
class User:
    """The authenticated user of a request."""

    username: str
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


def service_account(name: str, node: str | None = None) -> User:
    """A ServiceAccount of vgpu-system; with `node`, its token is bound to a pod on that node (1.30+)."""
    extra = {NODE_NAME_CLAIM: [node]} if node else {}
    return User(SERVICE_ACCOUNT.format(name), ("system:serviceaccounts", "system:serviceaccounts:vgpu-system",
                                                "system:authenticated"), extra)


TENANT = User("alice@example.com", ("tenants", "system:authenticated"))


@dataclass(frozen=True)
class Review:
    """One admission request: what it does to what, and who asks."""

    operation: str  # CREATE | UPDATE
    resource: str  # "pods", "pods/binding", "nodes", ...
    object: dict[str, Any]
    user: User
    old_object: dict[str, Any] | None = None
    namespace: str = "default"

    def request(self) -> dict[str, Any]:
        """`request` as kube-apiserver hands it to CEL (empty fields left out, as its JSON conversion does)."""
        resource, _, subresource = self.resource.partition("/")
        meta = self.object.get("metadata") or {}
        user: dict[str, Any] = {"username": self.user.username, "groups": list(self.user.groups)}
        if self.user.extra:
            user["extra"] = {k: list(v) for k, v in self.user.extra.items()}
        kind = {"group": "", "version": "v1", "kind": KINDS[self.resource]}
        out: dict[str, Any] = {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": kind, "requestKind": kind,
            "resource": {"group": "", "version": "v1", "resource": resource},
            "requestResource": {"group": "", "version": "v1", "resource": resource},
            "name": meta.get("name", ""),
            "operation": self.operation,
            "userInfo": user,
            "dryRun": False,
        }
        if subresource:
            out["subResource"] = out["requestSubResource"] = subresource
        if resource != "nodes":
            out["namespace"] = self.namespace
        return out


def _compile(expression: str) -> Any:
    try:
        return _ENV.compile(expression)
    except RuntimeError as exc:
        raise CELError(f"{expression!r} does not compile: {exc}") from None


def _eval(program: Any, expression: str, data: dict[str, Any]) -> Any:
    result = program.eval(data=data)
    if result.type() == cel.Type.ERROR:
        raise CELError(f"{expression!r}: {result.value()}")
    return result.plain_value()


class Policy:
    """One ValidatingAdmissionPolicy of deploy/, compiled."""

    def __init__(self, doc: dict[str, Any]) -> None:
        spec = doc["spec"]
        self.name = doc["metadata"]["name"]
        self.rules = spec["matchConstraints"]["resourceRules"]
        self.conditions = [(c["expression"], _compile(c["expression"])) for c in spec.get("matchConditions", ())]
        self.variables = [(v["name"], v["expression"], _compile(v["expression"])) for v in spec.get("variables", ())]
        self.validations = [(v, _compile(v["expression"]),
                             _compile(v["messageExpression"]) if "messageExpression" in v else None)
                            for v in spec["validations"]]

    def constant(self, name: str) -> Any:
        """The value of a variable that depends on no request (a list of names, say)."""
        (expression, program) = next((e, p) for n, e, p in self.variables if n == name)
        return _eval(program, expression, {"object": None, "oldObject": None, "request": None, "params": None,
                                           "namespaceObject": None, "variables": {}})

    def matches(self, review: Review) -> bool:
        """Whether matchConstraints select this request."""
        return any("" in rule["apiGroups"] and "v1" in rule["apiVersions"]
                   and (review.operation in rule["operations"] or "*" in rule["operations"])
                   and review.resource in rule["resources"] for rule in self.rules)

    def denials(self, review: Review) -> list[str]:
        """The messages of the validations this request fails; empty when it is admitted (or not matched).

        Raises CELError when an expression cannot be evaluated: a test must never count on failurePolicy."""
        if not self.matches(review):
            return []
        data: dict[str, Any] = {"object": review.object, "oldObject": review.old_object, "request": review.request(),
                                "params": None, "namespaceObject": None, "variables": {}}
        for expression, program in self.conditions:
            if not _eval(program, expression, data):
                return []
        for name, expression, program in self.variables:
            data["variables"] = {**data["variables"], name: _eval(program, expression, data)}
        messages = []
        for validation, program, message in self.validations:
            if not _eval(program, validation["expression"], data):
                text = _eval(message, validation["messageExpression"], data) if message else validation["message"]
                messages.append(" ".join(str(text).split()))
        return messages


@functools.cache
def policies() -> dict[str, Policy]:
    """The shipped policies, by name."""
    return {m.doc["metadata"]["name"]: Policy(m.doc) for m in load_manifests()
            if m.doc["kind"] == "ValidatingAdmissionPolicy"}


def denials(review: Review) -> dict[str, list[str]]:
    """What each shipped policy refuses about `review` (policies that admit it are left out)."""
    out = {}
    for name, policy in policies().items():
        found = policy.denials(review)
        if found:
            out[name] = found
    return out
