"""TEST INFRASTRUCTURE: mutating admission webhooks for the API-server stand-in, written from kube-apiserver's own
(kubernetes staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook: mutating/dispatcher.go `Dispatch`,
`callAttrMutatingHook`; mutating/reinvocationcontext.go; generic/webhook.go `ShouldCallHook`; predicates/rules,
predicates/namespace, predicates/object; matchconditions/matcher.go; request/admissionreview.go
`CreateAdmissionObjects`, `CreateV1AdmissionReview`, `VerifyAdmissionResponse`; errors/statuserror.go `ToStatusErr`;
staging/src/k8s.io/apiserver/pkg/util/webhook/client.go `HookClient` and error.go `ErrCallingWebhook`;
staging/src/k8s.io/apiserver/pkg/admission/configuration/mutating_webhook_manager.go for the order;
staging/src/k8s.io/apiserver/pkg/admission/reinvocation.go for the second round; pkg/apis/admissionregistration/v1
defaults.go). It imports nothing of the product.

What it does, as upstream does:
  * the stored MutatingWebhookConfigurations are taken in order of name, each one's webhooks in their order
    (`getMutatingWebhookConfigurations`); requests on the admission configuration kinds themselves are exempt
    (`IsExemptAdmissionConfigurationResource`);
  * a webhook is called when its namespaceSelector matches the namespace's labels (cluster-scoped requests always
    match; the stand-in serves no Namespace objects, so a namespace's labels are only `kubernetes.io/metadata.name`,
    as testbed/admission.py does), its objectSelector the object's or the old object's labels, one of its rules the
    request (operations, apiGroups, apiVersions, resources with `res/sub`, `res/*`, `*`, `*/*`, scope) and all its
    matchConditions (CEL, testbed/admission.py's environment: `object`, `oldObject`, `request`; one false skips the
    call; an error fails under failurePolicy Fail with kube-apiserver's 403 and skips under Ignore);
  * the call: an AdmissionReview (v1, or v1beta1 when that comes first in admissionReviewVersions; none of the two
    fails the call) POSTed to `url` (https) or to `service` (https://<name>.<namespace>.svc:<port><path>, port 443
    by default), `?timeout=<timeoutSeconds>s` added, TLS verified against the caBundle alone (the system roots when
    it is empty) and the server name (the URL's host, or `<name>.<namespace>.svc`), the whole call bounded by
    timeoutSeconds (default 10);
  * the response must be an AdmissionReview of the version sent with the request's uid (v1); `allowed: false`
    denies with its status as `ToStatusErr` makes it (`admission webhook "<name>" denied the request: <message>`, a
    code below 400 becomes 400); its warnings go to the client as `Warning: 299 - "<text>"` headers; a `patch`
    (base64 JSON Patch; only patchType JSONPatch) is applied, the object is defaulted again (the stand-in's pod
    defaulting: requests default to limits) and the next webhook sees the patched object;
  * a call that fails (connection refused, TLS, timeout, non-2xx, undecodable or invalid response, another uid, a
    patch that cannot be decoded, another patch type) denies under failurePolicy Fail (the default) with
    `Internal error occurred: failed calling webhook "<name>": ...` (500) and is skipped under Ignore; a patch that
    cannot be applied, or a patch on a DELETE, is an internal error whatever the policy;
  * a dryRun request fails with 400 at a webhook whose sideEffects is neither None nor NoneOnDryRun (upstream's
    `NewDryRunUnsupportedErr`: the request is refused, the webhook is not skipped);
  * reinvocation: when a webhook changes the object, the webhooks with reinvocationPolicy IfNeeded called before it
    are called once more after the first round (`webhookReinvokeContext`), as kube-apiserver's reinvoker does.

Deviations: a service is reached through `service_resolver` ((namespace, name, port) -> (host, port); the
stand-in has no Service network), the TLS server name staying `<name>.<namespace>.svc`; the text after
`failed to call webhook: Post "<url>": ` renders the Go net/http error for connection refused, unknown authority
and deadline exceeded, and Python's words otherwise; matchPolicy Equivalent has nothing to convert (every resource
is served in one version). Not done: audit annotations, the webhook client's authentication (kubeconfig of
`--admission-control-config-file`), the configuration objects' validation, `authorizer` in matchConditions.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import orjson
from cryptography import x509

from vgpu.testbed.admission import (
    NAMESPACE_NAME_LABEL,
    Attributes,
    Denied,
    _compile,
    _ConfigError,
    _eval,
    _EvalError,
    _rule_matches,
    _selector_matches,
)

__all__ = ["CONFIGURATION_KIND", "CONFIGURATION_PLURAL", "MutatingWebhooks", "ServiceResolver",
           "default_configuration", "warning_header"]

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ServiceResolver = Mapping[tuple[str, str, int], tuple[str, int]]

CONFIGURATION_KIND = "MutatingWebhookConfiguration"
CONFIGURATION_PLURAL = "mutatingwebhookconfigurations"
# rules.go IsExemptAdmissionConfigurationResource
_EXEMPT = {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
           "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
_REVIEW_VERSIONS = ("v1", "v1beta1")


def default_configuration(config: Obj) -> None:
    """SetDefaults_MutatingWebhook, SetDefaults_Rule, SetDefaults_ServiceReference (admissionregistration/v1)."""
    for hook in (config.get("webhooks") or []) if isinstance(config.get("webhooks"), list) else []:
        if not isinstance(hook, dict):
            continue
        hook.setdefault("failurePolicy", "Fail")
        hook.setdefault("matchPolicy", "Equivalent")
        hook.setdefault("namespaceSelector", {})
        hook.setdefault("objectSelector", {})
        hook.setdefault("timeoutSeconds", 10)
        hook.setdefault("reinvocationPolicy", "Never")
        for rule in hook.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
        service = (hook.get("clientConfig") or {}).get("service")
        if isinstance(service, dict):
            service.setdefault("port", 443)


def warning_header(text: str) -> str | None:
    """The `Warning` header kube-apiserver's recorder adds (apimachinery util/net `NewWarningHeader`: code 299,
    agent `-`, the text quoted with `"` and `\\` escaped); None for a text it would drop (empty or with control
    characters)."""
    if not text or any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text):
        return None
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _CallError(Exception):
    """webhookutil.ErrCallingWebhook: the webhook could not be talked to (the failure policy decides)."""


def _internal(message: str) -> Denied:
    """apierrors.NewInternalError."""
    return Denied(500, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": f"Internal error occurred: {message}", "reason": "InternalError",
                        "details": {"causes": [{"message": message}]}, "code": 500})


def _bad_request(message: str) -> Denied:
    """apierrors.NewBadRequest."""
    return Denied(400, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": message, "reason": "BadRequest", "details": {}, "code": 400})


def _forbidden(a: Attributes, message: str) -> Denied:
    """apierrors.NewForbidden(attr.GetResource().GroupResource(), attr.GetName(), err), as ShouldCallHook uses it."""
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    text = f'{qualified} "{a.name}" is forbidden: {message}' if a.name else f"{qualified} is forbidden: {message}"
    return Denied(403, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": text,
                        "reason": "Forbidden", "details": {"name": a.name, "group": a.group, "kind": a.resource},
                        "code": 403})


def _rejection(name: str, result: Any) -> Denied:
    """errors/statuserror.go ToStatusErr: the webhook's status, made a failure with a code of at least 400."""
    status = dict(result) if isinstance(result, dict) else {}
    code = status.get("code")
    if not isinstance(code, int) or code < 400:
        code = 400
    denied_by = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    if status.get("status") in (None, "", "Success"):
        status["status"] = "Failure"
    status.update({"kind": "Status", "apiVersion": "v1", "message": message, "code": code})
    status.setdefault("metadata", {})
    return Denied(code, status)


def _generic_server_response(code: int, body: bytes, content_type: str) -> str:
    """client-go's message for a non-2xx answer that is not a Status (apimachinery errors.go
    `NewGenericServerResponse`; the server's text is kept only for a text/* answer, as `newUnstructuredResponseError`
    does)."""
    try:
        status = orjson.loads(body)
        if isinstance(status, dict) and status.get("kind") == "Status" and status.get("message"):
            return str(status["message"])
    except orjson.JSONDecodeError:
        pass
    text = body[:1024].decode("utf-8", "replace").strip() if content_type.startswith("text/") else "unknown"
    fixed = {409: "the server reported a conflict", 404: "the server could not find the requested resource",
             400: "the server rejected our request for an unknown reason",
             401: "the server has asked for the client to provide credentials", 403: text,
             405: "the server does not allow this method on the requested resource",
             422: "the server rejected our request due to an error in our request",
             503: "the server is currently unable to handle the request",
             504: "the server was unable to return a response in the time allotted, but may still be processing the "
                  "request",
             429: "the server has received too many requests and has asked us to try again later"}
    if code in fixed:
        return fixed[code]
    if code >= 500:
        return f'an error on the server ("{text}") has prevented the request from succeeding'
    return f"the server responded with the status code {code} but did not return more information"


def _hostname_error(dial: tuple[str, int], server_name: str) -> str:
    """crypto/x509 HostnameError.Error(), from the certificate the server presents (fetched again, unverified)."""
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with socket.create_connection(dial, 2.0) as sock, context.wrap_socket(sock, server_hostname=server_name) as tls:
            der = tls.getpeercert(binary_form=True)
        cert = x509.load_der_x509_certificate(der or b"")
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception:  # no second look at the certificate: say what was wanted
        return f"x509: certificate is not valid for {server_name}"
    try:
        ipaddress.ip_address(server_name)
    except ValueError:
        valid = ", ".join(sans.get_values_for_type(x509.DNSName))
    else:
        ips = sans.get_values_for_type(x509.IPAddress)
        if not ips:
            return f"x509: cannot validate certificate for {server_name} because it doesn't contain any IP SANs"
        valid = ", ".join(str(ip) for ip in ips)
    if not valid:
        return f"x509: certificate is not valid for any names, but wanted to match {server_name}"
    return f"x509: certificate is valid for {valid}, not {server_name}"


def _go_error(exc: BaseException, dial: tuple[str, int], server_name: str) -> str:
    """How Go's net/http words the common failures (the others in Python's words)."""
    if isinstance(exc, ConnectionRefusedError):
        return f"dial tcp {dial[0]}:{dial[1]}: connect: connection refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "context deadline exceeded"
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in (2, 18, 19, 20, 21):
            return "tls: failed to verify certificate: x509: certificate signed by unknown authority"
        if exc.verify_code in (62, 64):  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
            return f"tls: failed to verify certificate: {_hostname_error(dial, server_name)}"
        if exc.verify_code in (9, 10):
            return "tls: failed to verify certificate: x509: certificate has expired or is not yet valid"
        return f"tls: failed to verify certificate: {exc.verify_message}"
    if isinstance(exc, socket.gaierror):
        return f"dial tcp: lookup {dial[0]}: no such host"
    return str(exc) or type(exc).__name__


class _HookConnection(http.client.HTTPSConnection):
    """An HTTPS connection to `host` (the TLS server name and Host header) dialled at another address."""

    def __init__(self, host: str, port: int, dial: tuple[str, int], context: ssl.SSLContext,
                 timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._dial = dial
        self._tls = context

    def connect(self) -> None:
        sock = socket.create_connection(self._dial, self.timeout)
        try:
            self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise


@dataclass(frozen=True, slots=True)
class _Target:
    url: str  # as upstream's error messages print it (without the timeout parameter)
    server_name: str
    port: int
    path: str
    dial: tuple[str, int] | None  # None: the service resolver does not know the service
    context: ssl.SSLContext
    unresolved: str = ""  # why there is nowhere to dial


@dataclass(frozen=True, slots=True)
class _Hook:
    uid: str  # <configuration>/<webhook>/<n>, as getMutatingWebhookConfigurations numbers duplicates
    configuration: str
    spec: Obj

    @property
    def name(self) -> str:
        return str(self.spec.get("name", ""))

    @property
    def fail(self) -> bool:
        return self.spec.get("failurePolicy") != "Ignore"


class MutatingWebhooks:
    """Calls the mutating webhooks of the configurations given to `admit` (see the module docstring)."""

    def __init__(self, apply_patch: Callable[[Any, list[Obj]], Any],
                 service_resolver: ServiceResolver | None = None) -> None:
        self.apply_patch = apply_patch
        self.service_resolver: dict[tuple[str, str, int], tuple[str, int]] = dict(service_resolver or {})
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._programs: dict[str, Any] = {}

    # -- which webhooks, in which order
    @staticmethod
    def _hooks(configurations: Iterable[Obj]) -> list[_Hook]:
        out = []
        for config in sorted(configurations, key=lambda c: c["metadata"]["name"]):
            seen: dict[str, int] = {}
            for spec in config.get("webhooks") or []:
                if not isinstance(spec, dict):
                    continue
                name = str(spec.get("name", ""))
                out.append(_Hook(f"{config['metadata']['name']}/{name}/{seen.get(name, 0)}",
                                 config["metadata"]["name"], spec))
                seen[name] = seen.get(name, 0) + 1
        return out

    def _should_call(self, hook: _Hook, a: Attributes) -> bool:
        """generic/webhook.go ShouldCallHook (raises Denied for an error that applies)."""
        spec = hook.spec
        ns_error = obj_error = None
        ns_match = True
        if a.namespace:
            try:
                ns_match = _selector_matches(spec.get("namespaceSelector"), {NAMESPACE_NAME_LABEL: a.namespace})
            except _ConfigError as exc:
                ns_match, ns_error = False, _internal(str(exc))
        if not ns_match and ns_error is None:
            return False
        obj_match = True
        selector = spec.get("objectSelector")
        if selector:
            try:
                obj_match = any(_selector_matches(selector, (o.get("metadata") or {}).get("labels") or {})
                                for o in (a.object, a.old_object) if isinstance(o, dict))
            except _ConfigError as exc:
                obj_match, obj_error = False, _internal(str(exc))
        if not obj_match and obj_error is None:
            return False
        if not any(isinstance(r, dict) and _rule_matches(r, a) for r in spec.get("rules") or []):
            return False
        if ns_error is not None:
            raise ns_error
        if obj_error is not None:
            raise obj_error
        conditions = spec.get("matchConditions") or []
        if not conditions:
            return True
        errors = []
        data: Obj = {"object": a.object, "oldObject": a.old_object, "request": a.request(), "params": None,
                     "namespaceObject": None, "variables": {}}
        for condition in conditions:
            expression = str(condition.get("expression", ""))
            try:
                value = _eval(self._program(expression), expression, data)
            except (_ConfigError, _EvalError) as exc:
                errors.append(str(exc))
                continue
            if value is False:
                return False  # matchconditions/matcher.go: any false skips the call, errors or not
            if value is not True:
                errors.append(f"expression '{expression}' resulted in error: no such overload: the result is not "
                              "a bool")
        if errors:
            if hook.fail:
                raise _forbidden(a, errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]")
            return False
        return True

    def _program(self, expression: str) -> Any:
        with self._lock:
            program = self._programs.get(expression)
        if program is None:
            program = _compile(expression)
            with self._lock:
                self._programs[expression] = program
        return program

    # -- the dispatcher
    def admit(self, configurations: Iterable[Obj], a: Attributes, *, options: Obj | None = None,
              default: Callable[[Obj], None] | None = None, warnings: list[str] | None = None) -> Obj | None:
        """The object after every webhook that applies (a.object when none does); raises Denied."""
        if a.group == "admissionregistration.k8s.io" and a.kind in _EXEMPT:
            return a.object
        hooks = self._hooks(configurations)
        obj = a.object
        previously_invoked: set[str] = set()
        reinvoke: set[str] = set()
        should_reinvoke = False
        for round_ in (0, 1):
            if round_ == 1 and not should_reinvoke:
                break
            for hook in hooks:
                attrs = replace(a, object=obj)
                if not self._should_call(hook, attrs):
                    continue
                if round_ == 1 and hook.uid not in reinvoke:
                    continue  # a webhook is never called for the first time in the second round
                changed = False
                failure: _CallError | None = None
                try:
                    obj, changed = self._call(hook, attrs, options, default, warnings)
                except _CallError as exc:
                    failure = exc
                if changed:
                    reinvoke |= previously_invoked
                    previously_invoked = set()
                    should_reinvoke = True
                if hook.spec.get("reinvocationPolicy") == "IfNeeded":
                    previously_invoked.add(hook.uid)
                if failure is not None:
                    message = f'failed calling webhook "{hook.name}": {failure}'
                    if hook.fail:
                        log.warning("failed calling webhook, failing closed webhook=%s error=%s", hook.name, failure)
                        raise _internal(message)
                    log.warning("failed calling webhook, failing open webhook=%s error=%s", hook.name, failure)
        return obj

    def _call(self, hook: _Hook, a: Attributes, options: Obj | None, default: Callable[[Obj], None] | None,
              warnings: list[str] | None) -> tuple[Obj | None, bool]:
        """callAttrMutatingHook: the object after this webhook and whether it changed."""
        spec, name = hook.spec, hook.name
        if a.dry_run:
            side_effects = spec.get("sideEffects")
            if side_effects is None:
                raise _CallError("Webhook SideEffects is nil")
            if side_effects not in ("None", "NoneOnDryRun"):
                raise _bad_request(f'admission webhook "{name}" does not support dry run')
        version = next((v for v in spec.get("admissionReviewVersions") or [] if v in _REVIEW_VERSIONS), None)
        if version is None:
            raise _CallError("could not create admission objects: webhook does not accept known AdmissionReview "
                             "versions (v1, v1beta1)")
        uid = str(uuid.uuid4())
        request = {"uid": uid, **a.request(), "object": a.object, "oldObject": a.old_object,
                   "options": options}
        review = {"kind": "AdmissionReview", "apiVersion": f"admission.k8s.io/{version}", "request": request}
        target = self._target(spec.get("clientConfig") or {})
        timeout = spec.get("timeoutSeconds")
        seconds = int(timeout) if isinstance(timeout, int) and timeout > 0 else 30
        response = self._post(target, orjson.dumps(review), seconds)
        result = self._verify(response, uid, version)
        for text in result.get("warnings") or []:
            if warnings is not None and isinstance(text, str):
                warnings.append(text)
        if result.get("allowed") is not True:
            raise _rejection(name, result.get("status"))
        raw_patch = result.get("patch")
        if not raw_patch:
            return a.object, False
        try:
            raw = base64.b64decode(raw_patch, validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:  # the []byte field did not decode
            raise _CallError(f"failed to call webhook: illegal base64 data: {exc}") from None
        try:
            ops = orjson.loads(raw)
            if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
                raise ValueError("a JSON patch is an array of operations")
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            raise _CallError(f"received undecodable patch in webhook response: {exc}") from None
        if not ops:
            return a.object, False
        if a.object is None:
            raise _internal(f'admission webhook "{name}" attempted to modify the object, which is not supported '
                            "for this operation")
        if result.get("patchType") != "JSONPatch":
            raise _CallError(f'unsupported patch type "{result.get("patchType") or ""}"')
        try:
            patched = self.apply_patch(a.object, ops)
        except Exception as exc:  # the API server's json_patch raises its StatusError
            raise _internal(getattr(exc, "message", None) or str(exc)) from None
        if not isinstance(patched, dict):
            raise _internal(f"the patch of admission webhook {name!r} does not leave an object")
        changed = patched != a.object
        if default is not None:
            default(patched)
        return patched, changed

    def _verify(self, response: Any, uid: str, version: str) -> Obj:
        """request/admissionreview.go VerifyAdmissionResponse (mutating)."""
        def invalid(why: str) -> _CallError:
            return _CallError(f"received invalid webhook response: {why}")

        if not isinstance(response, dict) or not isinstance(response.get("response"), dict):
            raise invalid("webhook response was absent")
        result: Obj = response["response"]
        if version == "v1":
            if result.get("uid") != uid:
                raise invalid(f'expected response.uid="{uid}", got "{result.get("uid") or ""}"')
            got = (response.get("apiVersion"), response.get("kind"))
            if got != ("admission.k8s.io/v1", "AdmissionReview"):
                raise invalid(f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got "
                              f"{got[0] or ''}, Kind={got[1] or ''}")
            if result.get("patch") and result.get("patchType") is None:
                raise invalid("webhook returned response.patch but not response.patchType")
            if not result.get("patch") and result.get("patchType") is not None:
                raise invalid("webhook returned response.patchType but not response.patch")
            if result.get("patchType") == "":
                raise invalid('webhook returned invalid response.patchType of ""')
        elif result.get("patch"):
            result = {**result, "patchType": "JSONPatch"}  # not verified in v1beta1: pinned to the one type
        return result

    # -- the HTTP call
    def _target(self, client_config: Obj) -> _Target:
        """webhookutil.ClientManager.HookClient: where to connect, what to verify."""
        try:
            context = self._context(str(client_config.get("caBundle") or ""))
        except (ValueError, ssl.SSLError) as exc:
            raise _CallError(f"could not get REST client: unable to load root certificates: {exc}") from None
        service = client_config.get("service")
        if isinstance(service, dict):
            namespace, name = str(service.get("namespace", "")), str(service.get("name", ""))
            port = int(service.get("port") or 443)
            server_name = f"{name}.{namespace}.svc"
            path = str(service.get("path") or "")
            dial = self.service_resolver.get((namespace, name, port))
            return _Target(f"https://{server_name}:{port}{path}", server_name, port, path, dial, context,
                           "" if dial is not None else f'service "{name}" not found')
        url = client_config.get("url")
        if not url:
            raise _CallError("webhook configuration must have either service or URL")
        parts = urlsplit(str(url))
        if parts.scheme != "https" or not parts.hostname:
            raise _CallError(f"could not get REST client: the stand-in calls only https:// URLs: {url}")
        port = parts.port or 443
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        return _Target(str(url), parts.hostname, port, path, (parts.hostname, port), context)

    def _context(self, ca_bundle: str) -> ssl.SSLContext:
        with self._lock:
            context = self._contexts.get(ca_bundle)
        if context is not None:
            return context
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.hostname_checks_common_name = False  # Go verifies subject alternative names only
        if ca_bundle:
            pem = base64.b64decode(ca_bundle, validate=True).decode("ascii", "replace")
            if "-----BEGIN CERTIFICATE-----" not in pem:
                raise ValueError("unable to parse bytes as PEM block")
            context.load_verify_locations(cadata=pem)
        else:
            context.load_default_certs()
        with self._lock:
            self._contexts[ca_bundle] = context
        return context

    def _post(self, target: _Target, body: bytes, seconds: int) -> Any:
        """POST the review within `seconds`; the decoded answer, or _CallError as client-go words it."""
        query = f"timeout={seconds}s"
        path = target.path or "/"
        path += ("&" if "?" in path else "?") + query
        shown = f"{target.url}{'&' if '?' in target.url else '?'}{query}"
        if target.dial is None:
            raise _CallError(f'failed to call webhook: Post "{shown}": {target.unresolved}')
        deadline = time.monotonic() + seconds
        conn = _HookConnection(target.server_name, target.port, target.dial, target.context, float(seconds))
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                           "Accept": "application/json, */*"})
            if conn.sock is not None:
                conn.sock.settimeout(max(0.001, deadline - time.monotonic()))
            answer = conn.getresponse()
            data = answer.read()
            code, content_type = answer.status, answer.getheader("Content-Type") or ""
        except (OSError, http.client.HTTPException) as exc:
            why = _go_error(exc, target.dial, target.server_name)
            raise _CallError(f'failed to call webhook: Post "{shown}": {why}') from None
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise _CallError(f'failed to call webhook: Post "{shown}": context deadline exceeded')
        if not 200 <= code < 300:
            raise _CallError(f"failed to call webhook: {_generic_server_response(code, data, content_type)}")
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise _CallError(f"failed to call webhook: couldn't decode the response: {exc}") from None
