"""A scripted HTTP extender for the kube-scheduler stand-in's tests: a protocol peer, not one of our components."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from vgpu.testbed.apiserver import ApiServerStandIn


class ScriptedExtender:
    """An HTTP extender whose answers are functions of the request (filter, prioritize, preempt; bind binds through
    the API server); records every call."""

    def __init__(self, api_url: str) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.api_url = api_url
        self.filter: Callable[[dict], Any] = self.pass_through
        self.prioritize: Callable[[dict], Any] = lambda body: [{"Host": n, "Score": 0} for n in body["NodeNames"]]
        # by default the candidates as they came, by UID (kube-scheduler's ProcessPreemption reads MetaVictims)
        self.preempt: Callable[[dict], Any] = lambda body: {
            "NodeNameToMetaVictims": body["NodeNameToMetaVictims"] or {
                node: {"Pods": [{"UID": p["metadata"]["uid"]} for p in victims["Pods"]],
                       "NumPDBViolations": victims["NumPDBViolations"]}
                for node, victims in body["NodeNameToVictims"].items()}}
        self.answering = threading.Event()   # cleared: every call is held unanswered until it is set again
        self.answering.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append((self.path, body))
                outer.answering.wait(60)
                if self.path == "/filter":
                    answer = outer.filter(body)
                elif self.path == "/prioritize":
                    answer = outer.prioritize(body)
                elif self.path == "/preempt":
                    answer = outer.preempt(body)
                else:
                    binding = {"apiVersion": "v1", "kind": "Binding",
                               "metadata": {"name": body["PodName"], "uid": body["PodUID"]},
                               "target": {"kind": "Node", "name": body["Node"]}}
                    resp = httpx.post(f"{outer.api_url}/api/v1/namespaces/{body['PodNamespace']}/pods/"
                                      f"{body['PodName']}/binding", json=binding)
                    answer = {"Error": "" if resp.status_code < 300 else resp.text}
                data = json.dumps(answer).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def pass_through(body: dict) -> dict:
        """Every node it is asked about passes (NodeNames when nodeCacheCapable, else the Nodes)."""
        if body["NodeNames"] is not None:
            return {"NodeNames": body["NodeNames"], "FailedNodes": {}}
        return {"Nodes": body["Nodes"], "FailedNodes": {}}

    def verbs(self) -> list[str]:
        return [path for path, _ in self.calls]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def driver_bed(tmp_path: Path) -> Iterator[tuple[ApiServerStandIn, str, ScriptedExtender, httpx.Client, list[Any]]]:
    """An API stand-in, its kubeconfig, a scripted extender, an HTTP client of the API and a list the test puts its
    scheduler drivers in; all stopped at the end (the drivers first)."""
    api = ApiServerStandIn().start()
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    ext = ScriptedExtender(api.url)
    http = httpx.Client(base_url=api.url)
    drivers: list[Any] = []
    try:
        yield api, kubeconfig, ext, http, drivers
    finally:
        for driver in drivers:
            driver.stop()
        ext.close()
        http.close()
        api.stop()
