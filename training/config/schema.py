"""The schema machinery every config section shares.

A section is a frozen dataclass whose fields are declared with ``setting()``: type,
default, bounds or allowed values, a description, a flat ``key`` and, for a pattern,
the rule in words (``says``). From that one declaration come

* validation (``Section.__post_init__``: every error names the field, the received
  value and what is allowed),
* ``FieldSpec``, the flat view a CLI flag, a form Param or a README row needs,
* ``allowed()``: the rule in words, the one renderer that error messages, CLI help,
  the reference tables (docs/) and the form's formats use,
* ``property_schema()``: the rule as JSON Schema (the config's schema, the form).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.errors import ConfigError, shown

JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string", dict: "object"}
OBJECT_WORDS = "an object of names to numbers, strings or booleans"
RULES = ("minimum", "maximum", "exclusive_minimum", "enum", "pattern")


def setting(default: Any, description: str, *, key: str | None = None,
            deployment: bool = False, **rules: Any) -> Any:
    """A config field with its schema in the metadata.

    rules: minimum, maximum (inclusive), exclusive_minimum, enum, nullable, and
    pattern with ``says``: the regular expression and the words that tell a person
    what it allows (errors and the trigger form show the words, never the pattern).
    deployment: set by whoever deploys the pipeline (paths, the store), never by the
    Airflow trigger form.
    """
    meta = {"description": description, "key": key, "deployment": deployment, **rules}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def allowed(rules: Mapping[str, Any], kind: str) -> str:
    """What a field allows, in words: ``between 1 and 1000``, ``one of 'a', 'b'``, ...

    ``rules`` are a field's rules (``FieldSpec.rules`` plus ``says``); ``kind`` its JSON
    type. Errors, CLI help, the reference tables and the trigger form all say it this way.
    """
    if "enum" in rules:
        return "one of " + ", ".join(repr(v) for v in rules["enum"])
    lo, hi = rules.get("minimum"), rules.get("maximum")
    if rules.get("exclusive_minimum") is not None:
        lo_txt = f"greater than {rules['exclusive_minimum']}"
        return lo_txt if hi is None else f"{lo_txt} and at most {hi}"
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    if lo is not None:
        return f"at least {lo}"
    if rules.get("says"):
        return rules["says"]
    return {"integer": "an integer", "number": "a number", "boolean": "true or false",
            "array": "a list of strings", "object": OBJECT_WORDS}.get(kind, "a string")


class Section:
    """Validation shared by every section: types, bounds, enums, patterns."""

    SECTION: str = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            object.__setattr__(self, f.name, check_value(self.SECTION, f, value))
        self._check_section()

    def _check_section(self) -> None:
        """Cross-field rules of one section; override where needed."""


def field_type(f: dataclasses.Field) -> tuple[type, bool]:
    """(base type, is list) of a field, from its annotation string."""
    ann = str(f.type).replace(" ", "")
    is_list = ann.startswith("list[")
    if ann.startswith("dict["):
        return dict, False
    base = ann.removeprefix("list[").removesuffix("]").replace("|None", "")
    return {"int": int, "float": float, "bool": bool, "str": str}[base], is_list


def check_value(section: str, f: dataclasses.Field, value: Any) -> Any:
    meta = f.metadata
    name = f"{section}.{f.name}"
    kind, is_list = field_type(f)
    if value is None:
        if meta.get("nullable"):
            return None
        raise ConfigError(f"{name} must be {allowed(meta, JSON_TYPES[kind])}, got None")
    if is_list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name} must be a list of strings, got {shown(value)}")
        return list(value)
    if kind is dict:
        # values: scalars (model.args), or anything with ``nested`` (sweep.space: its own
        # parser checks each distribution)
        scalar = object if meta.get("nested") else (int, float, bool, str)
        if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, scalar) for k, v in value.items()):
            raise ConfigError(f"{name} must be {meta.get('says') or OBJECT_WORDS}, got "
                              f"{shown(value)}")
        return dict(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(
            f"{name} must be {allowed(meta, JSON_TYPES[kind])}, got {shown(value)} "
            f"({type(value).__name__})"
        )
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {shown(value)}")
    bad = (
        ("enum" in meta and value not in meta["enum"])
        or (meta.get("minimum") is not None and value < meta["minimum"])
        or (meta.get("maximum") is not None and value > meta["maximum"])
        or (meta.get("exclusive_minimum") is not None and value <= meta["exclusive_minimum"])
        or ("pattern" in meta and not re.fullmatch(meta["pattern"], value))
    )
    if bad:
        raise ConfigError(
            f"{name} must be {allowed(meta, JSON_TYPES[kind])}, got {shown(value)}")
    return value


@dataclass(frozen=True)
class FieldSpec:
    """One configuration field, flattened: what a CLI flag or a form Param needs."""

    section: str
    name: str
    key: str
    type: str  # "integer" | "number" | "boolean" | "string" | "array" | "object"
    default: Any
    description: str
    nullable: bool
    deployment: bool
    rules: dict[str, Any]
    says: str | None = None  # the pattern's rule in words
    nested: bool = False  # an object whose values are objects (sweep.space)

    @property
    def optional(self) -> bool:
        """Empty by default: the field may be left out (empty or null means not set)."""
        return self.default in ("", None, [], {})

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def allowed(self) -> str:
        """What the field allows, in words (``allowed()``)."""
        return allowed({**self.rules, "says": self.says}, self.type)


def field_specs(sections: Mapping[str, type[Section]]) -> list[FieldSpec]:
    """Every field of every section, flattened, in declaration order."""
    specs = []
    for section, cls in sections.items():
        for f in dataclasses.fields(cls):
            kind, is_list = field_type(f)
            meta = dict(f.metadata)
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            rules = {k: meta[k] for k in RULES if meta.get(k) is not None}
            specs.append(FieldSpec(
                section=section, name=f.name, key=meta["key"] or f.name,
                type="array" if is_list else JSON_TYPES[kind], default=default,
                description=meta["description"], nullable=bool(meta.get("nullable")),
                deployment=meta["deployment"], rules=rules, says=meta.get("says"),
                nested=bool(meta.get("nested")),
            ))
    keys = [s.key for s in specs]
    assert len(keys) == len(set(keys)), f"duplicate config keys: {keys}"
    return specs


def property_schema(spec: FieldSpec) -> dict[str, Any]:
    """The JSON Schema of one field (also the trigger form's Param schema)."""
    prop: dict[str, Any] = {
        "type": [spec.type, "null"] if spec.nullable else spec.type,
        "default": spec.default,
        "description": spec.description,
    }
    if spec.type == "array":
        prop["items"] = {"type": "string"}
    if spec.type == "object":
        prop["additionalProperties"] = {"type": "object" if spec.nested else
                                        ["string", "number", "integer", "boolean"]}
    rules = dict(spec.rules)
    if "exclusive_minimum" in rules:
        prop["exclusiveMinimum"] = rules.pop("exclusive_minimum")
    prop.update(rules)
    return prop


