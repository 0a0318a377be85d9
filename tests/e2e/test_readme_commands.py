"""The `vgpu` commands that README.md and docs/ show in their shell blocks: each one is accepted by the command's
parser as written, and the demo commands a reader is told to run end with PASS. (The replay command of the
placement table runs for minutes; tests/replay runs the same code on small traces.)
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


def shell_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `vgpu`) of every `vgpu` command line in a sh/bash (or unlabelled) block of README.md and
    docs/*.md; `$(hostname)` stands for a node name."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
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
            if "vgpu " not in text:
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
                if words and Path(words[0]).name == "vgpu" and not synopsis:
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
