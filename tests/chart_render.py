"""The Helm chart rendered by the real Helm engine (helm-python), as `helm template` would, for the tests that
apply it or take objects from it."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "vgpu-sharing"


def render(values: dict | None = None, name: str = "vgpu-sharing", namespace: str = "vgpu-system") -> list[dict]:
    """Every object of the chart's render with `values`, in the order of its templates."""
    rendered = helm.Chart.load(str(CHART)).render(values or {}, name=name, namespace=namespace)
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def webhook_configuration(docs: list[dict] | None = None) -> dict:
    """The MutatingWebhookConfiguration of `docs` (default: the chart's default render)."""
    (doc,) = [d for d in (docs if docs is not None else render()) if d["kind"] == "MutatingWebhookConfiguration"]
    return doc
