"""Every YAML, TOML and JSON snippet in docs/ parses, so the guides never rot; snippets that are whole
Kubernetes objects are also validated against the schemas. The guides of issue 8 exist, and the options
page names every option the issue lists."""

import json
import re
import tomllib

import kubernetes_validate
import pytest
import yaml
from deploy_helpers import DEPLOY, DOCS

K8S_VERSION = "1.34"
LANGUAGES = {"yaml": "yaml", "yml": "yaml", "toml": "toml", "json": "json"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
GUIDES = (
    "install.md",
    "node-setup-docker.md",
    "node-setup-containerd.md",
    "node-setup-k3s.md",
    "gpu-operator.md",
    "taints-tolerations.md",
    "migrate-from-nvidia-device-plugin.md",
    "deviceplugin-options.md",
)


def snippets(path):
    """(language, first line number, text) of each fenced block of a Markdown file, dedented to its fence."""
    out = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["lang"].lower()
        body, start = [], i + 1
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        assert i < len(lines), f"{path.name}:{start}: unclosed code fence"
        out.append((lang, start, "\n".join(body) + "\n"))
        i += 1
    return out


def all_snippets():
    """Parametrisation: every YAML/TOML/JSON block of docs/ and deploy/README.md."""
    files = sorted(DOCS.rglob("*.md")) + [DEPLOY / "README.md"]
    params = []
    for path in files:
        for lang, line, text in snippets(path):
            if lang in LANGUAGES:
                params.append(pytest.param(LANGUAGES[lang], text, id=f"{path.name}:{line}:{lang}"))
    return params


def parse(kind, text):
    """The documents of one snippet."""
    if kind == "yaml":
        return [d for d in yaml.safe_load_all(text) if d is not None]
    if kind == "toml":
        return [tomllib.loads(text)]
    return [json.loads(text)]


@pytest.mark.parametrize("kind, text", all_snippets())
def test_snippet_parses(kind, text, no_network):
    docs = parse(kind, text)
    assert docs, "empty snippet"
    for doc in docs:
        if isinstance(doc, dict) and {"apiVersion", "kind", "metadata"} <= set(doc):
            error = None
            try:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            except kubernetes_validate.utils.SchemaNotFoundError:
                pass  # CRDs and config kinds: parsing is all we can check
            except kubernetes_validate.ValidationError as exc:
                error = f"invalid at {'.'.join(str(p) for p in exc.path)}: {exc.message}"
            if error:
                pytest.fail(f"{doc['kind']}/{doc['metadata'].get('name')} {error}")


@pytest.mark.parametrize("name", GUIDES)
def test_guide_exists_with_checked_snippets(name):
    path = DOCS / name
    assert path.is_file(), f"docs/{name} missing"
    langs = {lang for lang, _, _ in snippets(path)}
    assert langs & set(LANGUAGES), f"docs/{name} has no checked snippet"


def test_key_settings_are_in_parsed_snippets():
    def blocks(name, lang):
        return [parse(LANGUAGES[lang], t) for language, _, t in snippets(DOCS / name) if language == lang]

    (daemon,) = blocks("node-setup-docker.md", "json")
    assert daemon[0]["default-runtime"] == "nvidia" and "nvidia" in daemon[0]["runtimes"]
    for name in ("node-setup-containerd.md", "node-setup-k3s.md"):
        defaults = []
        for (doc,) in blocks(name, "toml"):
            for plugin in doc["plugins"].values():
                defaults.append(plugin["containerd"]["default_runtime_name"])
        assert defaults and set(defaults) == {"nvidia"}, name
    values = [d for docs in blocks("gpu-operator.md", "yaml") for d in docs if "devicePlugin" in d]
    assert values and values[0]["devicePlugin"]["enabled"] is False
    k3s = [d for docs in blocks("node-setup-k3s.md", "yaml") for d in docs]
    assert {"default-runtime": "nvidia"} in k3s


def test_install_guide_uses_our_names():
    text = (DOCS / "install.md").read_text()
    for needle in ("kubectl apply -k deploy/", "vgpu-sharing/device-plugin=true", "schedulerName: vgpu-scheduler",
                   ":9394/metrics", "create secret generic vgpu-grant-key --from-file=key=grant.key",
                   "create configmap vgpu-grant-public-keys --from-file=keys.pem=grant.pub"):
        assert needle in text, needle


# Issue 8's option list: each must be documented with its flag and its environment variable.
ISSUE_8_OPTIONS = [
    ("--fail-on-init-error", "FAIL_ON_INIT_ERROR"),
    ("--nvidia-driver-root", "NVIDIA_DRIVER_ROOT"),
    ("--pass-device-specs", "PASS_DEVICE_SPECS"),
    ("--device-list-strategy", "DEVICE_LIST_STRATEGY"),
    ("--device-id-strategy", "DEVICE_ID_STRATEGY"),
    ("--mig-strategy", "MIG_STRATEGY"),
    ("--config-file", "CONFIG_FILE"),
    (None, "DP_DISABLE_HEALTHCHECKS"),
]


@pytest.mark.parametrize("flag, env", ISSUE_8_OPTIONS, ids=lambda v: v or "")
def test_options_page_documents_issue_8_option(flag, env):
    text = (DOCS / "deviceplugin-options.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| `") and f"`{env}`" in ln]
    assert len(rows) == 1, f"{env}: expected one table row"
    if flag:
        assert f"`{flag}`" in rows[0]
        assert f"### `{flag}` / `{env}`" in text, f"{flag}: no section with an example"
    else:
        assert f"/ `{env}`" in text, f"{env}: no section with an example"


def test_options_page_config_example_uses_the_documented_keys():
    text = (DOCS / "deviceplugin-options.md").read_text()
    documented = set(re.findall(r"`(flags(?:\.\w+)+)`", text))
    for lang, _, body in snippets(DOCS / "deviceplugin-options.md"):
        if lang != "yaml":
            continue
        for doc in parse("yaml", body):
            if doc.get("version") != "v1" or "flags" not in doc:
                continue

            def walk(node, prefix):
                for key, value in node.items():
                    path = f"{prefix}.{key}"
                    if isinstance(value, dict):
                        walk(value, path)
                    else:
                        assert path in documented, f"{path} used in an example but not in the tables"

            walk(doc["flags"], "flags")


def test_readmes_short_install_creates_the_grant_key_before_installing_the_chart():
    """The components mount the Secret `vgpu-grant-key` and the ConfigMap `vgpu-grant-public-keys`: without them
    they wait in ContainerCreating."""
    text = (DEPLOY.parent / "README.md").read_text()
    install = text[text.index("## Install on a real cluster"):]
    for step in ("create secret generic vgpu-grant-key", "create configmap vgpu-grant-public-keys"):
        assert step in install
        assert install.index(step) < install.index("helm install vgpu-sharing ./charts/vgpu-sharing")


def test_readme_says_the_step_the_demos_over_limit_pod_allocates_in():
    demo = (DEPLOY.parent / "testbed" / "demo.py").read_text()
    call = demo[demo.index('_pod("over-limit"'):]
    chunk = re.search(r'"--chunk", "(\d+)"', call)
    assert chunk is not None
    assert f"`over-limit` allocates in {chunk[1]} MiB steps" in (DEPLOY.parent / "README.md").read_text()
