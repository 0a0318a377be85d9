"""Configuration files: a YAML mapping read and validated into a pydantic model, with errors in one line.

Used by the scheduler's and the device plugin's configuration (`scheduler/config.py`, `deviceplugin/config.py`).
Every error is a ConfigError whose message starts with the option or file as the user wrote it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from vgpu.errors import ConfigError

__all__ = ["read_yaml_mapping", "validated"]

Model = TypeVar("Model", bound=BaseModel)


def read_yaml_mapping(path: str | Path, label: str) -> dict[str, Any]:
    """The mapping at the top of a YAML file (empty for an empty file); `label` names the option (`--config`)."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{label} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{label} {path}: not a text file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{label} {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{label} {path}: expected a mapping at the top level")
    return loaded


def validated(model: type[Model], data: dict[str, Any], where: str) -> Model:
    """`data` validated as `model`; the first error names the key: `sharing.split_count: ... (from FILE)`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "config"
        raise ConfigError(f"{key}: {first['msg']} (from {where})") from None
