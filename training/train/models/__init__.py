"""Models by name: built in, from an installed package, or a ``module:function``.

``model.name`` finds a builder in this order:

1. the built-in registry (``builtin.py``: ``mlp``, ``cnn``; ``@register("name")``);
2. an installed package's entry point in the group ``training.models``
   (``[project.entry-points."training.models"] tiny = "my_models:tiny"``);
3. an explicit ``package.module:function`` reference.

**The contract.** A builder is ``builder(input_shape, num_classes, *, **args)``: the
dataset's image shape (height, width, channels; the input is raw uint8 pixels) and its
class count, plus its own keyword-only arguments, each with a default and an annotation
of ``int``, ``float``, ``bool`` or ``str`` (``Annotated[int, Between(32, 1024)]`` adds
bounds): they are ``model_args`` in the config, and ``check_args`` validates them
against that declaration before anything runs. It returns an uncompiled ``keras.Model``
whose output is ``(batch, num_classes)`` probabilities; compiling, the strategy scope,
mixed precision and the float32 output stay the product's. A pretrained part the
product may load weights into and fine-tune (``model.weights``, ``freeze_epochs``) is a
layer named ``backbone`` (``backbones.py``). Custom layers are registered with
``keras.saving.register_keras_serializable`` (never a ``Lambda``), so exported models
load with ``safe_mode=True``.

Every refusal is one ``ConfigError`` line that names the model.
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from training.errors import ConfigError, shown

Builder = Callable[..., Any]
MODELS: dict[str, Builder] = {}  # the built-in registry
ENTRY_POINT_GROUP = "training.models"
REFERENCE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
LAYOUT_RULES = "layout_rules"  # a builder's attribute: how it splits over devices
BACKBONE = "backbone"  # the layer ``model.weights`` and ``freeze_epochs`` act on


@dataclass(frozen=True)
class Between:
    """Bounds of a numeric builder argument: ``Annotated[float, Between(0.0, 0.9)]``."""

    low: float
    high: float

    def __str__(self) -> str:
        return f"between {self.low} and {self.high}"


@dataclass(frozen=True)
class Argument:
    """One declared builder argument: its type, default and bounds (or None)."""

    kind: type
    default: Any
    bounds: Between | None = None

    def __str__(self) -> str:
        bounds = f", {self.bounds}" if self.bounds else ""
        return f"{self.kind.__name__}, default {self.default!r}{bounds}"


def register(name: str) -> Callable[[Builder], Builder]:
    def add(builder: Builder) -> Builder:
        if name in MODELS:
            raise ValueError(f"model {name!r} is already registered")
        MODELS[name] = builder
        return builder

    return add


def installed() -> dict[str, Any]:
    """Installed packages' models: entry points of ``training.models``, by name (not
    loaded: listing them imports nothing)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """Every model a name can pick: built in first, then installed ones."""
    return list(MODELS) + sorted(set(installed()) - set(MODELS))


def resolve(name: str) -> Builder:
    """The builder ``name`` picks (module doc), or ConfigError naming it."""
    if name in MODELS:
        return MODELS[name]
    plugins = installed()
    if name in plugins:
        return _loaded(name, lambda: plugins[name].load(),
                       f"entry point {plugins[name].value!r}")
    if REFERENCE.match(name):
        module, _, function = name.partition(":")
        return _loaded(name, lambda: getattr(importlib.import_module(module), function),
                       "the reference")
    raise ConfigError(
        f"model.name {name!r} is not a model: built in {', '.join(MODELS)}; installed "
        f"{', '.join(sorted(plugins)) or '(none)'}; or a reference like my_pkg.models:build")


def _loaded(name: str, load: Callable[[], Any], what: str) -> Builder:
    try:
        builder = load()
    except Exception as exc:  # an import error, a missing attribute: user code
        raise ConfigError(f"model {name!r}: cannot load {what} ({type(exc).__name__}: "
                          f"{shown(exc)})") from None
    if not callable(builder):
        raise ConfigError(f"model {name!r}: {what} is {type(builder).__name__}, not a "
                          "builder function")
    return builder


def parameters(name: str, builder: Builder) -> dict[str, Argument]:
    """The builder's own arguments: keyword-only, annotated, with defaults."""
    try:
        signature = inspect.signature(builder)
        hints = inspect.get_annotations(builder, eval_str=True)
    except (TypeError, ValueError, NameError) as exc:
        raise ConfigError(f"model {name!r}: cannot read the builder's signature "
                          f"({shown(exc)})") from None
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != 2:
        raise ConfigError(f"model {name!r}: a builder takes (input_shape, num_classes) and "
                          f"keyword-only arguments, its signature is {signature}")
    declared = {}
    for param in signature.parameters.values():
        if param.kind is not param.KEYWORD_ONLY:
            continue
        kind, extra = hints.get(param.name), ()
        if typing.get_origin(kind) is typing.Annotated:
            kind, extra = kind.__origin__, kind.__metadata__
        bounds = [b for b in extra if isinstance(b, Between)]
        if kind not in _KINDS or param.default is param.empty:
            raise ConfigError(f"model {name!r}: argument {param.name!r} needs a default and "
                              "an annotation of int, float, bool or str")
        if bounds and kind not in (int, float):
            raise ConfigError(f"model {name!r}: argument {param.name!r} is a "
                              f"{kind.__name__}: Between bounds only int and float")
        declared[param.name] = Argument(kind, param.default, bounds[0] if bounds else None)
    return declared


def check_args(name: str, builder: Builder, args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` checked against the builder's declaration; every argument, defaults
    filled in. ConfigError names the model, the argument, the value and what is allowed."""
    declared = parameters(name, builder)
    listed = ", ".join(f"{k} ({arg})" for k, arg in declared.items()) or "none"
    out = {k: arg.default for k, arg in declared.items()}
    for key, value in args.items():
        if key not in declared:
            raise ConfigError(f"model.args: {key!r} is not an argument of model "
                              f"{name!r}; its arguments: {listed}")
        kind, bounds = declared[key].kind, declared[key].bounds
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(f"model.args.{key} of model {name!r} must be "
                              f"{_KINDS[kind]}, got {shown(value)} ({type(value).__name__})")
        if bounds and not bounds.low <= value <= bounds.high:
            raise ConfigError(f"model.args.{key} of model {name!r} must be {bounds}, got "
                              f"{shown(value)}")
        out[key] = value
    return out


def layout_rules(name: str) -> dict[str, tuple[str | None, ...]]:
    """How model ``name`` is split over the mesh's ``model`` axis (``runtime.model_parallel``
    under jax): its builder's ``layout_rules`` attribute, ``{variable path regex: axes}``
    as Keras's ``LayoutMap`` reads it (``{"dense.*/kernel$": ("model", None)}``: each
    device holds a slice of those kernels' rows). ConfigError when it gives none."""
    rules = getattr(resolve(name), LAYOUT_RULES, None)
    if not rules:
        raise ConfigError(
            f"runtime.model_parallel asks to split model {name!r} over devices, but it "
            f"gives no layout rules: set its builder's `{LAYOUT_RULES}` attribute (a dict "
            "of variable path patterns to axes, docs/models.md), or set "
            "runtime.model_parallel to 1")
    checked = {}
    for pattern, axes in dict(rules).items():
        if not isinstance(pattern, str) or not isinstance(axes, (tuple, list)) or not all(
                a is None or isinstance(a, str) for a in axes):
            raise ConfigError(f"model {name!r}: layout rule {shown(pattern)}: "
                              f"{shown(axes)} must map a pattern to a tuple of axis names "
                              "or None, e.g. ('model', None)")
        checked[pattern] = tuple(axes)
    return checked


def build(name: str, input_shape: tuple[int, ...], num_classes: int,
          args: Mapping[str, Any] | None = None) -> Any:
    """The uncompiled model ``name`` builds for this data, checked: a Keras model whose
    output is (batch, num_classes). ConfigError names the model when it is not."""
    import keras

    builder = resolve(name)
    arguments = check_args(name, builder, args or {})
    try:
        model = builder(tuple(input_shape), int(num_classes), **arguments)
    except Exception as exc:
        raise ConfigError(f"model {name!r} failed to build for input {tuple(input_shape)} "
                          f"and {num_classes} classes ({type(exc).__name__}: "
                          f"{shown(exc)})") from None
    if not isinstance(model, keras.Model):
        raise ConfigError(f"model {name!r} returned {type(model).__name__}, not a "
                          "keras.Model")
    shape = tuple(model.outputs[0].shape) if len(model.outputs) == 1 else None
    if shape is None or len(shape) != 2 or shape[-1] != num_classes:
        raise ConfigError(f"model {name!r} outputs {shape or len(model.outputs)}; the "
                          f"dataset has {num_classes} classes: it must output (batch, "
                          f"{num_classes})")
    return model


from training.train.models import builtin  # noqa: E402,F401,I001  (mlp, cnn first)
from training.train.models import backbones  # noqa: E402,F401  (then the backbones)
