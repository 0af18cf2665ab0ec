"""The serving layout: production as integer-numbered SavedModel folders.

TensorFlow Serving, and KServe's TensorFlow runtime (``--model_base_path``), read a base
path of integer-named version folders, serve the highest number and pick up a new one
without a restart; a folder named otherwise is not a version to them. TFX's Pusher
writes that layout for each blessed model, and so does this module for each move of the
production pointer (``ProductionPointer``)::

    serving/<name>/<N>/saved_model.pb, variables/..., assets/..., fingerprint.pb
    serving/<name>/serving.json      which registry version each N holds, newest last

N is the number of moves in the pointer's history up to this one: it rises with every
promotion and every rollback (a rollback pushes the older model as a new N, so "the
highest number" is always production), a retried push finds the same N, and two pushes
never take the same N because the pointer's conditional write orders the moves.

A folder is written whole before it can be served: ``saved_model.pb``, the file without
which no server loads a SavedModel, is written last, after every variable and asset
(an object store has no atomic rename of a folder). The last ``keep`` folders stay; older
ones are removed, ``saved_model.pb`` first, so a folder being removed is never servable
either. The store's versions are never touched: the registry stays the truth.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from training.errors import RegistryError
from training.layout import (
    SAVED_MODEL_DIR,
    SAVED_MODEL_PB,
    SERVING_INDEX,
    serving_prefix,
    version_key,
    version_prefix,
)
from training.registry.store import Store

__all__ = ["ServingLayout", "move_number"]

log = logging.getLogger(__name__)


def move_number(pointer: dict[str, Any]) -> int:
    """The serving number of the pointer's current version: how many records of its
    history moved production (a rejection or a timeout moves nothing)."""
    return sum(1 for record in pointer.get("history", ())
               if record.get("to") is not None and record.get("to") != record.get("from"))


class ServingLayout:
    """Pushes production's SavedModel to ``serving/<name>/<N>/`` and reads it back."""

    def __init__(self, store: Store, keep: int = 5):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise RegistryError(f"serving keep must be a whole number of folders from 1, "
                                f"got {keep!r}")
        self.store = store
        self.keep = keep

    def base_uri(self, name: str) -> str:
        """What a server's ``model_base_path`` (or KServe's ``storageUri``) names."""
        return f"{self.store.uri.rstrip('/')}/{serving_prefix(name)}".rstrip("/")

    def numbers(self, name: str) -> list[int]:
        """The servable folders' numbers (those with a ``saved_model.pb``), ascending."""
        base = serving_prefix(name)
        return sorted(int(folder) for folder in self.store.list_folders(base)
                      if folder.isdigit()
                      and self.store.exists(f"{base}{folder}/{SAVED_MODEL_PB}"))

    def served(self, name: str) -> int | None:
        """TF Serving's rule: the highest servable number, or None."""
        numbers = self.numbers(name)
        return numbers[-1] if numbers else None

    def index(self, name: str) -> list[dict[str, Any]]:
        """``serving.json``: ``{"number", "version"}`` for each push, oldest first."""
        found = self.store.get_with_etag(serving_prefix(name) + SERVING_INDEX)
        return [] if found is None else json.loads(found[0])["pushed"]

    def push(self, name: str, pointer: dict[str, Any]) -> int | None:
        """Write the pointer's version as folder N (``move_number``) and drop folders
        beyond ``keep``; N. Pushing the same move again changes nothing. A version
        without a SavedModel (not one this pipeline published) is left out, with a
        warning; None."""
        version = pointer.get("version")
        if version is None:
            raise RegistryError(f"model {name!r} has nothing in production to serve")
        number = move_number(pointer)
        folder = serving_prefix(name, number)
        pushed = self.index(name)
        done = {"number": number, "version": version}
        if done in pushed and self.store.exists(folder + SAVED_MODEL_PB):
            return number
        source = version_prefix(name, version) + f"{SAVED_MODEL_DIR}/"
        keys = self.store.list(source)
        if source + SAVED_MODEL_PB not in keys:
            log.warning("serving: model %s version %s has no SavedModel (%s/): %s left as "
                        "it was", name, version, version_key(name, version, SAVED_MODEL_DIR),
                        self.base_uri(name))
            return None
        keys.sort(key=lambda key: key == source + SAVED_MODEL_PB)  # the marker last
        with tempfile.TemporaryDirectory(prefix="serving-") as tmp:
            for key in keys:
                local = Path(tmp) / "file"
                self.store.get_file(key, local)
                self.store.put_file(folder + key[len(source):], local)
        record = [*(p for p in pushed if p["number"] != number), done]
        self.store.put_bytes(serving_prefix(name) + SERVING_INDEX,
                             json.dumps({"name": name, "pushed": record}, indent=1).encode())
        log.info("serving: %s version %s is folder %d of %s", name, version, number,
                 self.base_uri(name))
        self._prune(name, number)
        return number

    def _prune(self, name: str, newest: int) -> None:
        base = serving_prefix(name)
        for folder in self.store.list_folders(base):
            if folder.isdigit() and int(folder) <= newest - self.keep:
                keys = self.store.list(f"{base}{folder}/")
                keys.sort(key=lambda key: key != f"{base}{folder}/{SAVED_MODEL_PB}")
                for key in keys:  # the marker first: never a servable partial folder
                    self.store.delete(key)
