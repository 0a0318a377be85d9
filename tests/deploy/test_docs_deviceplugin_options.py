"""docs/deviceplugin-options.md against the code: every option of vgpu.deviceplugin.config.OPTIONS has its table row
with the same flag, environment variable and file key, and every `version: v1` example is accepted by the
plugin's own loader of NVIDIA-layout files."""

import re

import pytest
import yaml
from deploy_helpers import DOCS

from vgpu.deviceplugin.config import OPTIONS, read_options_file

PAGE = DOCS / "deviceplugin-options.md"


def rows() -> list[list[str]]:
    out = []
    for line in PAGE.read_text().splitlines():
        if line.startswith("| `--"):
            out.append([cell.strip() for cell in line.strip("|").split("|")])
    return out


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.file_key or o.env], ids=lambda o: o.flag)
def test_table_row_matches_the_code(option):
    (row,) = [r for r in rows() if r[0] == f"`{option.flag}`"]
    assert row[1] == (f"`{option.env}`" if option.env else "(none)")
    assert row[2] == (f"`{option.file_key}`" if option.file_key else "(none)")


def test_yaml_examples_in_nvidia_layout_are_accepted(tmp_path):
    text = PAGE.read_text()
    bodies = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    checked = 0
    for i, body in enumerate(bodies):
        doc = yaml.safe_load(body)
        if isinstance(doc, dict) and doc.get("version") == "v1" and "flags" in doc:
            path = tmp_path / f"example-{i}.yaml"
            path.write_text(body)
            read_options_file(str(path))
            checked += 1
        elif isinstance(doc, dict) and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            path = tmp_path / f"example-{i}.yaml"
            path.write_text(doc["data"]["config.yaml"])
            read_options_file(str(path))
            checked += 1
    assert checked >= 5
