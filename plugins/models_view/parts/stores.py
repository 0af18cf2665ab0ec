"""The model store the page reads: the deployment's, opened with the connection's keys,
and the small JSON files of published versions, cached.

The registry is reopened every ``STORE_CACHE_S`` seconds. ``STORES.secrets`` holds the
connection's keys as soon as they are read, so that any text shown afterwards (an error
from opening or reading the store included) is scrubbed of them. A published version's
files never change (its manifest is written last, once), so the JSON files the page
reads from them (``evaluation.json``, ``config.json``, ``sweep.json``) are kept in a
bounded cache, keyed by the store, the key and what identifies that version's
publication; of a file that may be large, only the part the page shows is kept.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from models_view.parts.answers import Refused

log = logging.getLogger(__name__)

STORE_CACHE_S = 60.0
JSON_CACHE_ENTRIES = 4096


class StoreCache:
    """The registry on the deployment's store, reopened every STORE_CACHE_S seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entry: tuple[tuple[str, str], float, Any] | None = None
        self.secrets: frozenset[str] = frozenset()

    def get(self) -> Any:
        from training.deployment import Deployment
        from training.registry import open_store
        from training.registry.versions import ModelRegistry
        from training_airflow.store import s3_options

        deployment = Deployment.from_env()
        key = (deployment.store.text, deployment.aws_conn_id)
        with self._lock:
            entry = self._entry
            if entry is None or entry[0] != key or time.monotonic() - entry[1] > STORE_CACHE_S:
                self._entry = None
                options = s3_options(*key)
                if options is not None:
                    keys = (options.aws_access_key_id, options.aws_secret_access_key,
                            options.aws_session_token)
                    self.secrets = self.secrets | {k for k in keys if k}
                entry = self._entry = (key, time.monotonic(),
                                       ModelRegistry(open_store(key[0], options)))
        return entry[2]


STORES = StoreCache()


def scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def display_uri(uri: str) -> str:
    """The store URI without any user info (``scheme://user:pass@host`` loses ``user:pass@``)."""
    parts = urlsplit(uri)
    if parts.netloc and "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    return uri


def store_failure(exc: Exception) -> Refused:
    """The 502 page for a store that cannot be read, its text scrubbed of the keys."""
    text = scrub(f"{type(exc).__name__}: {exc}", STORES.secrets)
    log.warning("Models page cannot read the model store: %s", text)
    return Refused(502, "Model store unavailable", f"Cannot read the model store: {text}")


class JsonFiles:
    """Parsed JSON files of published versions, least recently used dropped first."""

    def __init__(self, entries: int = JSON_CACHE_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._entries = entries
        self._cache: OrderedDict[Hashable, Any] = OrderedDict()

    def read(self, registry: Any, key: str, publication: Hashable,
             sha256: str | None = None, keep: Callable[[Any], Any] | None = None) -> Any:
        """The JSON at ``key`` of ``registry``'s store; None if it is not JSON, or does not
        match ``sha256`` (the version's manifest's) when given. ``publication`` tells this
        version's publication from another under the same key (a version deleted and
        published again). ``keep``: what of the parsed value to return and cache (a
        module-level function, so it is the same object at every call), the whole value
        when None."""
        from training.files import sha256_bytes

        cache_key = (registry.store.uri, key, publication, sha256, keep)
        with self._lock:
            if cache_key in self._cache:
                self._cache.move_to_end(cache_key)
                return self._cache[cache_key]
        data = registry.store.get_bytes(key)
        value = None
        if sha256 is None or sha256_bytes(data) == sha256:
            try:
                value = json.loads(data)
            except ValueError:
                log.warning("Models page: %s is not valid JSON", key)
            if keep is not None and value is not None:
                value = keep(value)
        with self._lock:
            self._cache[cache_key] = value
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return value


JSON_FILES = JsonFiles()
