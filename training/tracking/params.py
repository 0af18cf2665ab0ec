"""A run's frozen config as MLflow params and tags: flat, bounded, and without secrets.

MLflow params are flat strings (at most 6000 characters, 100 a call). The config is
flattened to ``section.field`` (a sweep's space and a model's args one level further),
values as JSON. A secret never becomes a param: a field named like one (password,
secret, token, credential, access key) is left out, and a URI's password is masked,
although the config's own checks refuse both already.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

MAX_VALUE = 6000
SECRET_NAME = re.compile(r"pass(word)?|secret|token|credential|access_key|api_key", re.I)
URI_PASSWORD = re.compile(r"(://[^/:@\s]+):[^/@\s]+@")


def _flat(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping) and value and prefix.count(".") < 2:
        for key, inner in value.items():
            yield from _flat(f"{prefix}.{key}" if prefix else str(key), inner)
    else:
        yield prefix, value


def clean(text: str) -> str:
    """``text`` with any URI password masked, cut to MLflow's limit."""
    return URI_PASSWORD.sub(r"\1:***@", text)[:MAX_VALUE]


def flat_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The frozen config (``RunConfig.to_dict()``) as ``section.field`` -> text."""
    params = {}
    for key, value in _flat("", config):
        if SECRET_NAME.search(key.rsplit(".", 1)[-1]):
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        params[key] = clean(text)
    return params
