"""What the cluster submit tools (infra/emr/submit.py, infra/dataproc/submit.py) check in a pipeline file
before anything leaves this machine: that it reads, which passwords sit in it as plain text, and which
environment variables its secrets read (the driver needs each)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

SECRET_KEY = re.compile(r"(?i)(password|secret|token|credential)")
"""A Spark setting whose name says it carries a secret: refused in a request anyone who can describe it reads."""


def secret_setting(key: str) -> bool:
    """Whether a Spark setting's name says it carries a secret (`...credentials.provider` names a class)."""
    return SECRET_KEY.search(key) is not None and not key.endswith("provider")


def job_arguments(config: Path) -> list[str]:
    """The job's own arguments: the pipeline file is shipped into the driver's working directory."""
    return ["--config", config.name, "--until-caught-up"]


def check_distinct_names(*paths: Path | None) -> None:
    """The shipped files land in one directory (a prefix, the driver's working directory): names must differ."""
    names = [p.name for p in paths if p is not None]
    if len(set(names)) != len(names):
        raise ValueError(f"the archive, the job and the pipeline file need distinct file names, got {names}")


def plaintext_passwords(data: Any, path: str = "") -> list[str]:
    """Key paths of the pipeline file whose key names a password and whose value is a plain string."""
    found: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            where = f"{path}.{key}" if path else str(key)
            if "password" in str(key).lower() and isinstance(value, str):
                found.append(where)
            else:
                found += plaintext_passwords(value, where)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += plaintext_passwords(value, f"{path}[{i}]")
    return found


def env_references(data: Any) -> list[str]:
    """Names of the environment variables the pipeline file's `{env: NAME}` secrets read."""
    if isinstance(data, Mapping):
        if len(data) == 1 and "env" in data and isinstance(data["env"], str):
            return [data["env"]]
        return sorted({name for value in data.values() for name in env_references(value)})
    if isinstance(data, list):
        return sorted({name for value in data for name in env_references(value)})
    return []


def read_pipeline(config: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(config.read_text())
    except OSError as e:
        raise ValueError(f"cannot read pipeline file {config}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"pipeline file {config} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"pipeline file {config} must be a YAML mapping")
    return data
