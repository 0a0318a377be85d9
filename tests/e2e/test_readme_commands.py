"""The `vgpu` and `helm` commands that README.md and docs/ show in their shell blocks: each `vgpu` command is
accepted by the command's parser as written, the demo commands a reader is told to run end with PASS, and each
`helm install`/`helm upgrade` of our chart renders with the values it sets, by the real Helm engine. (The replay
command of the placement table runs for minutes; tests/replay runs the same code on small traces.)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vgpu.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*```(\w*)")


def shell_commands(program: str = "vgpu") -> list[tuple[str, list[str]]]:
    """(where, argv after the program) of every `program` command line in a sh/bash (or unlabelled) block of
    README.md, docs/*.md and the chart's README; `$(hostname)` stands for a node name."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "charts/vgpu-sharing/README.md"]:
        block: str | None = None
        pending = ""
        for number, line in enumerate(path.read_text().splitlines(), 1):
            fence = FENCE.match(line)
            if fence:
                block = None if block is not None else fence.group(1)
                continue
            if block not in ("sh", "bash", "shell", ""):
                continue
            text = (pending + line.split(" #", 1)[0].rstrip()).replace("$(hostname)", "node-1")
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            if f"{program} " not in text:
                continue
            lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            redirected = False
            for token in [*lexer, ";"]:
                if token in (">", ">>", "<", "2>"):
                    redirected = True  # the rest up to the next operator is a file name
                elif token not in ("&&", "||", ";", "|", "&"):
                    if not redirected:
                        words.append(token)
                    continue
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value prefixes
                synopsis = any(w.startswith("[") for w in words)  # usage notation, not a command
                if words and Path(words[0]).name == program and not synopsis:
                    found.append((f"{path.name}:{number}", words[1:]))
                words, redirected = [], False
    return found


COMMANDS = shell_commands()


def test_the_docs_show_vgpu_commands():
    assert any(argv[:1] == ["demo"] for _, argv in COMMANDS)
    assert any(argv[:1] == ["replay"] for _, argv in COMMANDS)


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[f"{w} vgpu {' '.join(a)}"[:90] for w, a in COMMANDS])
def test_each_command_parses_as_written(where, argv):
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `vgpu {' '.join(argv)}` is refused by the parser (exit {exc.code})")


DEMOS = [(where, argv) for where, argv in COMMANDS if argv[:1] == ["demo"] and "--headless" in argv]


@pytest.mark.slow
@pytest.mark.parametrize("where, argv", DEMOS, ids=[" ".join(a) for _, a in DEMOS])
def test_each_headless_demo_passes(where, argv):
    res = subprocess.run([sys.executable, "-m", "vgpu.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0 and "vgpu demo: PASS" in res.stdout, f"{where}:\n{res.stdout[-3000:]}{res.stderr}"


HELM = [(where, argv) for where, argv in shell_commands("helm")
        if argv[:1] in (["install"], ["upgrade"]) and "./charts/vgpu-sharing" in argv]


def _set_value(values: dict, assignment: str) -> None:
    """One `--set key.path=value` as Helm's strvals reads it: dotted keys, `{a,b}` lists, true/false and integers."""
    key, _, raw = assignment.partition("=")
    value: object
    if raw.startswith("{") and raw.endswith("}"):
        value = [item for item in raw[1:-1].split(",") if item]
    elif raw in ("true", "false"):
        value = raw == "true"
    elif re.fullmatch(r"-?[0-9]+", raw):
        value = int(raw)
    else:
        value = raw
    *parents, leaf = key.split(".")
    for part in parents:
        values = values.setdefault(part, {})
    values[leaf] = value


def test_the_docs_show_helm_commands_of_the_chart():
    assert any(argv[0] == "install" for _, argv in HELM) and any(argv[0] == "upgrade" for _, argv in HELM)


@pytest.mark.parametrize("where, argv", HELM, ids=[f"{w} helm {' '.join(a)}"[:90] for w, a in HELM])
def test_each_helm_command_renders_the_chart(where, argv):
    import helm_python as helm
    import yaml

    values: dict = {}
    namespace = "default"
    words = iter(argv[2:])
    for word in words:
        if word in ("--namespace", "-n"):
            namespace = next(words)
        elif word == "--set":
            _set_value(values, next(words))
        elif word == "--set-file":
            key, _, _path = next(words).partition("=")
            _set_value(values, f"{key}=-----BEGIN PUBLIC KEY-----")
        elif word not in ("--create-namespace", "--reuse-values", "--install", "./charts/vgpu-sharing"):
            pytest.fail(f"{where}: helm option {word!r} is not understood by this test")
    rendered = helm.Chart.load(str(ROOT / "charts" / "vgpu-sharing")).render(values, name=argv[1],
                                                                                namespace=namespace)
    docs = [d for path, text in rendered.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    assert any(d["kind"] == "Deployment" and d["metadata"]["name"] == "vgpu-scheduler" for d in docs), where
    for image in values.get("image", {}).values():
        assert any(image in yaml.safe_dump(d) for d in docs if d["kind"] == "Deployment"), (where, image)
