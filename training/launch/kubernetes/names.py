"""Kubernetes' name rules, once, and the names of a run's objects.

``job_name(run_id)`` names the run's ConfigMap, Service and Job alike; ``run_id_label``
is the run id as a label value. Both derive from the run id only, so a retry of the
same run finds the objects of its earlier try.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from training.config.sections import MAX_WORKERS
from training.errors import ConfigError, shown

# A pod's hostname is "<job>-<index>" and must stay a 63-character DNS label.
MAX_JOB_NAME = 63 - len(f"-{MAX_WORKERS - 1}")

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123, at most 63
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # starts with a letter
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

DNS_LABEL_WORDS = ("a DNS-1123 label (a-z, 0-9 and '-', at most 63 characters, starting "
                   "and ending with a letter or digit)")
OBJECT_NAME_WORDS = "DNS-1123 subdomain: a-z, 0-9, '-' and '.', at most 253 characters"


def is_dns_label(value: Any) -> bool:
    """A namespace, a Service or a host name: at most 63 of a-z, 0-9 and '-'."""
    return isinstance(value, str) and len(value) <= 63 and bool(DNS_LABEL.match(value))


def is_object_name(value: Any) -> bool:
    """A ConfigMap, Secret, ServiceAccount or PersistentVolumeClaim name."""
    return isinstance(value, str) and len(value) <= 253 and bool(DNS_SUBDOMAIN.match(value))


def is_label_key(key: str) -> bool:
    """``[prefix/]name``: a DNS subdomain prefix and a name of at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if prefix and not is_object_name(prefix):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(LABEL_VALUE.match(value))


def _hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def job_name(run_id: str) -> str:
    """The Job (and Service, ConfigMap) name of a run: ``train-<run id>``.

    A DNS-1035 label of at most ``MAX_JOB_NAME`` characters, so ``<job>-<index>`` is a
    valid pod hostname. A run id that had to be changed (case, characters, length) gets
    a hash of the original appended, so different run ids never share a name and the
    same run id always gets the same one.
    """
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError(f"run id must be a non-empty string, got {shown(run_id)}")
    name = f"train-{run_id}"
    if len(name) <= MAX_JOB_NAME and DNS_1035.match(name):
        return name
    base = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    suffix = "-" + _hash(run_id)
    head = f"train-{base}"[: MAX_JOB_NAME - len(suffix)].rstrip("-")
    return head + suffix


def run_id_label(run_id: str) -> str:
    """The run id as a label value (at most 63 characters; hashed when it had to change)."""
    if is_label_value(run_id):
        return run_id
    suffix = "-" + _hash(run_id)
    head = re.sub(r"[^A-Za-z0-9._-]+", "-", run_id)[: 63 - len(suffix)]
    head = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", head)
    return (head + suffix) if head else suffix.lstrip("-")
