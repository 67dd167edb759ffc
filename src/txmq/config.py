"""RocketMQ-style configuration files (``key=value``) mapped onto dataclasses with RocketMQ's key names."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from txmq.errors import ConfigError

T = TypeVar("T")


def read_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text: ``key=value`` or ``key: value``, ``#``/``!`` comments, ``\\`` continuations."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + lines[i].strip()
            i += 1
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            result[line] = ""
            continue
        result[match.group(1)] = match.group(2).strip()
    return result


def load_properties(path: str | Path) -> dict[str, str]:
    try:
        return read_properties(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc.strerror}") from exc


def camel_to_snake(name: str) -> str:
    """``brokerClusterName`` -> ``broker_cluster_name``, ``brokerIP1`` -> ``broker_ip1``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.lower()


def _convert(value: str, hint: Any, key: str) -> Any:
    base = hint
    args = getattr(hint, "__args__", None)
    if args:
        base = next((a for a in args if a is not type(None)), str)
    try:
        if base is bool:
            lowered = value.strip().lower()
            if lowered not in ("true", "false"):
                raise ValueError(value)
            return lowered == "true"
        if base is int:
            return int(value.strip())
        if base is float:
            return float(value.strip())
        return value
    except ValueError:
        raise ConfigError(f"configuration key {key}: {value!r} is not a valid {base.__name__}") from None


def apply_properties(config: T, props: dict[str, str], *, strict: bool = False) -> dict[str, str]:
    """Set the fields of a config dataclass from RocketMQ-named keys; return the keys it does not know."""
    hints = get_type_hints(type(config))
    names = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    unknown: dict[str, str] = {}
    for key, value in props.items():
        field_name = camel_to_snake(key) if key not in names else key
        if field_name not in names:
            unknown[key] = value
            continue
        setattr(config, field_name, _convert(value, hints[field_name], key))
    if strict and unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
    return unknown
