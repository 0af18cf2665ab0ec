"""The search space: which config fields a sweep varies and how, parsed and checked.

``sweep.space`` maps a config field (``fit.learning_rate``, ``model.args.units``) to a
distribution, one of::

    {"float": [low, high], "log": true}     a real number in [low, high] (log scale)
    {"float": [low, high], "step": 0.05}    ... on a grid of that step
    {"int": [low, high]}                    an integer in [low, high] ("log", "step" too)
    {"choices": [32, 64, 128]}              one of these values

Here each distribution is checked on its own (its shape, bounds, choices); whether the
field exists and takes those values is the config's check (``training/config/sweep.py``),
which knows the other sections. Nothing here imports Optuna, Keras or the config.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.errors import ConfigError, shown

MAX_PARAMS = 32  # fields one sweep may search
KINDS = ("float", "int", "choices")
OPTIONS = {"float": ("log", "step"), "int": ("log", "step"), "choices": ()}
Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class Param:
    """One searched field: ``path`` (``section.field`` or ``model.args.<name>``) and its
    distribution: a ``float`` or ``int`` range (``low``, ``high``, ``log``, ``step``) or
    ``choices``."""

    path: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Scalar, ...] = ()

    @property
    def where(self) -> str:
        """How errors name it: ``sweep.space['fit.learning_rate']``."""
        return f"sweep.space[{self.path!r}]"

    def values_to_check(self) -> list[Any]:
        """The values the field's own check must accept: the bounds or every choice."""
        return list(self.choices) if self.kind == "choices" else [self.low, self.high]

    def grid_values(self) -> Sequence[Any]:
        """The values a grid walks: every choice, or every integer of an ``int`` range
        (by ``step``); ConfigError for a continuous range."""
        if self.kind == "choices":
            return self.choices
        if self.kind == "int" and not self.log:
            return range(int(self.low), int(self.high) + 1, int(self.step or 1))
        what = "a log-scaled int range" if self.kind == "int" else "a float range"
        raise ConfigError(
            f"{self.where} is {what} {shown(self.spec())} but sweep.sampler is 'grid', which "
            "walks a finite set of values: give it choices (or an int range without "
            "log), or set sweep.sampler to 'random' or 'tpe'")

    def spec(self) -> dict[str, Any]:
        """The distribution as it is written in the space."""
        if self.kind == "choices":
            return {"choices": list(self.choices)}
        spec: dict[str, Any] = {self.kind: [self.low, self.high]}
        if self.log:
            spec["log"] = True
        if self.step is not None:
            spec["step"] = self.step
        return spec


def canonical(space: Any) -> dict[str, Any]:
    """``space`` (an object, or its JSON text: a form's text box, an older config) as a
    plain JSON object with sorted keys: the config holds it so, and equal spaces read
    the same."""
    if isinstance(space, str):
        if not space.strip():
            return {}
        try:
            space = json.loads(space)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"sweep.space must be a JSON object of config fields to "
                              f"distributions, got {shown(space)}: {exc}") from None
    if not isinstance(space, Mapping):
        raise ConfigError(f"sweep.space must be a JSON object of config fields to "
                          f"distributions, got {shown(space)}")
    try:
        return json.loads(json.dumps(space, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"sweep.space must be a JSON object of config fields to "
                          f"distributions, got {shown(space)}: {exc}") from None


def parse(space: Mapping[str, Any]) -> dict[str, Param]:
    """``space`` (``canonical``'s), each distribution checked alone; ConfigError naming
    the field, what was received and what is allowed."""
    if not space:
        return {}
    if len(space) > MAX_PARAMS:
        raise ConfigError(f"sweep.space may search at most {MAX_PARAMS} fields, got "
                          f"{len(space)}")
    return {path: _param(path, spec) for path, spec in space.items()}


def _param(path: str, spec: Any) -> Param:
    where = f"sweep.space[{path!r}]"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where} must be a distribution like {{\"float\": [0.0001, 0.1], "
                          f"\"log\": true}}, {{\"int\": [16, 256]}} or {{\"choices\": [32, 64]}}, "
                          f"got {shown(spec)}")
    kinds = [k for k in KINDS if k in spec]
    if len(kinds) != 1:
        raise ConfigError(f"{where} must name exactly one of 'float', 'int', 'choices', "
                          f"got {shown(dict(spec))}")
    kind = kinds[0]
    extra = set(spec) - {kind, *OPTIONS[kind]}
    if extra:
        allowed = ", ".join(repr(k) for k in (kind, *OPTIONS[kind]))
        raise ConfigError(f"{where}: unknown key {sorted(extra)[0]!r} for a {kind!r} "
                          f"distribution; allowed: {allowed}")
    if kind == "choices":
        return Param(path, kind, choices=_choices(where, spec["choices"]))
    return _range(where, path, kind, spec)


def _is_number(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


def _range(where: str, path: str, kind: str, spec: Mapping[str, Any]) -> Param:
    bounds, words = spec[kind], "integers" if kind == "int" else "finite numbers"
    if (not isinstance(bounds, (list, tuple)) or len(bounds) != 2
            or not all(_is_number(b, kind) for b in bounds)):
        raise ConfigError(f"{where}: {kind!r} must be [low, high], two {words}, got "
                          f"{shown(bounds)}")
    low, high = bounds
    if low >= high:
        raise ConfigError(
            f"{where}: {kind!r} bounds must rise, low below high, got [{low}, {high}]"
            + (": one value is a setting, not a search; set the field itself"
               if low == high else ": swap them"))
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: 'log' must be true or false, got {shown(log)}")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log-scaled range must start above 0, got low {low}")
    step = spec.get("step")
    if step is not None:
        if not _is_number(step, kind) or step <= 0:
            raise ConfigError(f"{where}: 'step' must be a positive "
                              f"{'integer' if kind == 'int' else 'number'}, got {shown(step)}")
        if log:
            raise ConfigError(f"{where}: 'step' and 'log' cannot go together (a log scale "
                              "has no fixed step); drop one")
        if step > high - low:
            raise ConfigError(f"{where}: 'step' {step} is wider than the range [{low}, "
                              f"{high}]: it would leave one value")
    if kind == "float":
        low, high = float(low), float(high)
    return Param(path, kind, low=low, high=high, log=log, step=step)


def _choices(where: str, choices: Any) -> tuple[Scalar, ...]:
    if not isinstance(choices, (list, tuple)):
        raise ConfigError(f"{where}: 'choices' must be a list of values, got {shown(choices)}")
    seen = set()
    for value in choices:
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise ConfigError(f"{where}: each choice must be a string, number, true, false "
                              f"or null, got {shown(value)}")
        key = (type(value).__name__, value)
        if key in seen:
            raise ConfigError(f"{where}: choice {shown(value)} is listed twice")
        seen.add(key)
    if len(choices) < 2:
        raise ConfigError(f"{where}: 'choices' must list at least two values, got "
                          f"{shown(list(choices))}"
                          + (": one value is a setting, not a search; set the field itself"
                             if choices else ""))
    return tuple(choices)


def grid_size(params: Mapping[str, Param]) -> int:
    """How many points the grid over ``params`` has (ConfigError for a continuous one)."""
    return math.prod(len(p.grid_values()) for p in params.values())


def grid_points(params: Mapping[str, Param], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` distinct grid points, in an order shuffled by ``seed``: the same points
    in the same order for the same space and seed (a plan made again is the same plan).
    The grid is never listed whole, only indexed."""
    axes = [(path, p.grid_values()) for path, p in sorted(params.items())]
    size = math.prod(len(values) for _, values in axes)
    points = []
    for index in random.Random(seed).sample(range(size), min(count, size)):
        point = {}
        for path, values in reversed(axes):
            index, at = divmod(index, len(values))
            point[path] = values[at]
        points.append(dict(sorted(point.items())))
    return points
