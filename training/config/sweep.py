"""The ``sweep`` section: a hyperparameter search over the run's own fields, off by default.

``SweepConfig`` holds the section's fields and its own rules (``_check_section``);
``check_sweep(cfg)`` the rules that need the other sections: each searched field must
exist, be one a run may vary (not one that defines the run: which data, which model,
where it runs and is stored) and take every value its distribution can give.
``training.config.run.check_across`` calls it, so a bad space fails the run's first
task, before anything is staged. The space itself is parsed by ``training.sweep.space``.
docs/sweeps.md.

Over 300 lines on purpose, and why: the section's fields, what may be searched and why
not, and every rule across them are the one contract a sweep's config keeps.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from training.config.schema import JSON_TYPES, Section, check_value, field_type, setting
from training.errors import ConfigError, shown
from training.sweep.space import Param, canonical, grid_size, parse
from training.train.models import check_args, parameters, resolve

MAX_TRIALS = 1000
MAX_PARALLEL = 64
STORAGE_PATTERN = r"^$|^[a-z][a-z0-9]*(\+[a-z0-9_]+)?://.*$"
# The distributions a field of each JSON type takes: float for numbers, int for integers
# and numbers, choices for any single value; none for a list or an object.
TAKES = {"float": ("number",), "int": ("integer", "number"),
         "choices": ("integer", "number", "boolean", "string")}

# Fields a sweep may not vary, and why. Besides these: every deployment field and the
# sweep section itself; model.args is searched argument by argument (model.args.<name>).
REFUSED = {
    **dict.fromkeys(
        ("dataset.name", "dataset.version", "dataset.source", "dataset.uri",
         "dataset.image_shape", "dataset.until", "dataset.window_days",
         "dataset.test_percent", "dataset.validation_percent",
         "dataset.validation_fraction", "dataset.decoded_copy"),
        "it decides which data the trials train and are measured on: they share one staged "
        "dataset, so their objectives compare"),
    "model.name": "it is the model the sweep tunes (one model's sweep; run one per model)",
    "storage.model_name": "the trials are one model's; the sweep publishes under one name",
    "fit.early_stopping_monitor": "it is the sweep's objective: trials measured on "
                                  "different metrics do not compare",
    **dict.fromkeys(
        ("runtime.backend", "runtime.strategy", "runtime.model_parallel",
         "runtime.accelerator", "runtime.devices", "runtime.num_gpus", "runtime.workers",
         "runtime.launcher", "runtime.tpu"),
        "it decides where and on what the trials run: they share the sweep's placement"),
}
REFUSED_SECTIONS = {
    "validation": "the data checks run once, before the trials",
    "promotion": "it decides after the sweep, on the picked trial only",
    "sweep": "it is the sweep itself",
}


@dataclass(frozen=True)
class SweepConfig(Section):
    SECTION = "sweep"

    trials: int = setting(
        0, "Trials of a hyperparameter sweep (docs/sweeps.md): each trains the config "
        "with the searched fields of sweep_space replaced, and the best completed one "
        "goes on; 0: no sweep, one run.", key="sweep_trials", minimum=0, maximum=MAX_TRIALS,
    )
    parallel: int = setting(
        1, "Trials that train at the same time (at most sweep_trials).",
        key="sweep_parallel", minimum=1, maximum=MAX_PARALLEL,
    )
    sampler: str = setting(
        "tpe", "How the next trial's values are chosen: tpe (Optuna's TPE, learning from "
        "the trials done), random, or grid (every combination of choices and int "
        "ranges, in a seeded order; sweep_trials at most the grid's size).",
        key="sweep_sampler", enum=["tpe", "random", "grid"],
    )
    pruner: str = setting(
        "median", "Stopping trials that fall behind, after each epoch: median (below the "
        "median of the completed trials at that epoch, after a warm-up), hyperband "
        "(successive halving from 1 epoch to fit.epochs), none.",
        key="sweep_pruner", enum=["median", "hyperband", "none"],
    )
    space: dict[str, Any] = setting(
        {}, "The fields searched, as a JSON object of config fields to distributions, e.g. "
        "{\"fit.learning_rate\": {\"float\": [0.0001, 0.1], \"log\": true}, "
        "\"fit.batch_size\": {\"choices\": [32, 64, 128]}, \"model.args.dropout\": "
        "{\"float\": [0.0, 0.5]}} (int ranges: {\"int\": [16, 256]}).", key="sweep_space",
        nested=True,
        says="empty, or a JSON object of config fields to distributions",
    )
    max_failed: int = setting(
        0, "Failed trials the sweep tolerates; with more, or with none completed, the "
        "sweep fails naming the failed trials, their values and reasons (the first three, "
        "then how many more). Pruned trials are not failures.",
        key="sweep_max_failed", minimum=0, maximum=MAX_TRIALS,
    )
    timeout_minutes: int = setting(
        0, "Budget of the whole sweep, from its first trial: a trial not started by then "
        "is skipped, one running stops after its epoch; 0: no budget.",
        key="sweep_timeout_minutes", minimum=0, maximum=10_080,
    )
    seed: int = setting(
        0, "Seed of the sampler (each trial's draw is seeded by it, the run id and the "
        "trial's number, so a retried trial draws the same values).", key="sweep_seed",
        minimum=0, maximum=2**31 - 1,
    )
    continue_previous: bool = setting(
        False, "Continue this model's earlier sweeps over the same space and objective: "
        "the first trial runs the previous sweep's best values, and the earlier trials "
        "(recorded with their data's fingerprint, never counted as tonight's) inform the "
        "sampler and the pruner.", key="sweep_continue",
    )
    storage: str = setting(
        "", "Where the Optuna study lives: empty is a SQLite file under the runs directory "
        "(one machine); a SQLAlchemy URL such as postgresql+psycopg2://optuna@db:5432/optuna "
        "for trials on several workers. Never a password: it comes from PGPASSWORD or "
        "~/.pgpass, or from TRAINING_SWEEP_STORAGE_PASSWORD at connect time.",
        key="sweep_storage", deployment=True, pattern=STORAGE_PATTERN,
        says="empty, or a SQLAlchemy database URL without a password, like "
             "postgresql+psycopg2://user@host:5432/optuna",
    )

    def __post_init__(self) -> None:
        # Given as an object or as its JSON text; the config holds the object, keys sorted.
        object.__setattr__(self, "space", canonical(self.space))
        if isinstance(self.storage, str):  # before any error could echo a password
            check_storage(self.storage)
        super().__post_init__()

    @property
    def enabled(self) -> bool:
        return self.trials > 0

    @property
    def params(self) -> dict[str, Param]:
        """The space, parsed (``training.sweep.space``)."""
        return parse(self.space)

    def _check_section(self) -> None:
        params = self.params
        if not self.enabled:
            defaults = {f.name: f.default_factory() if f.default is dataclasses.MISSING
                        else f.default for f in dataclasses.fields(self)}
            for f in dataclasses.fields(self):
                value = getattr(self, f.name)
                if not f.metadata["deployment"] and value != defaults[f.name]:
                    raise ConfigError(
                        f"sweep.{f.name} is {shown(value)} but sweep.trials is 0 (no sweep): "
                        "it would be ignored; set sweep.trials to the trials to run, or "
                        f"leave sweep.{f.name} at its default {shown(defaults[f.name])}")
            return
        if not params:
            raise ConfigError(f"sweep.trials is {self.trials} but sweep.space is empty: "
                              "name the fields to search, e.g. {\"fit.learning_rate\": "
                              "{\"float\": [0.0001, 0.1], \"log\": true}}")
        if self.parallel > self.trials:
            raise ConfigError(f"sweep.parallel must be at most sweep.trials ({self.trials}), "
                              f"got {self.parallel}")
        if self.sampler == "grid":
            size = grid_size(params)  # refuses a continuous range, naming it
            if self.trials > size:
                raise ConfigError(
                    f"sweep.trials is {self.trials} but the grid of sweep.space has "
                    f"{size} points: set sweep.trials to at most {size}, or widen the grid")
            if self.continue_previous:
                raise ConfigError(
                    "sweep.continue is true but sweep.sampler is 'grid': a grid walked on an "
                    "earlier night has nothing new to give; set sweep.continue false, or "
                    "sweep.sampler to 'tpe' or 'random'")


def check_storage(url: str) -> None:
    """A study storage URL must not hold a password (in the URL or its query)."""
    if not url:
        return
    parts = urlsplit(url)
    in_query = any(k.lower() == "password" for k in parse_qs(parts.query))
    if parts.password is not None or in_query:
        raise ConfigError(
            f"sweep.storage must not hold a password, got {shown(redact(url))}: a config is "
            "written into the run directory and shown in logs; drop it from the URL and "
            "give it through PGPASSWORD or ~/.pgpass (libpq), or "
            "TRAINING_SWEEP_STORAGE_PASSWORD")


def redact(url: str) -> str:
    """``url`` with any password in it (user info or query) replaced by ``***``; the rest
    as it was written."""
    parts, shown_url = urlsplit(url), url
    if parts.password is not None:
        userinfo, _, host = parts.netloc.rpartition("@")
        shown_url = shown_url.replace(parts.netloc,
                                      f"{userinfo.partition(':')[0]}:***@{host}", 1)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", shown_url)


def check_sweep(cfg: Any) -> None:
    """The sweep's rules across sections (``check_across`` calls it): every searched field
    exists, may be varied and takes every value its distribution can give; pruning needs
    one training process per trial; hyperband's epochs are fixed."""
    sweep = cfg.sweep
    if not sweep.enabled:
        return
    fields = _fields(cfg)
    for path, param in sweep.params.items():
        if path.startswith("model.args."):
            _check_model_arg(cfg, param)
        else:
            _check_field(path, param, fields)
    if sweep.pruner != "none" and cfg.runtime.workers > 1:
        raise ConfigError(
            f"sweep.pruner is {sweep.pruner!r} but runtime.workers is "
            f"{cfg.runtime.workers}: every worker of a trial would have to stop at the same "
            "epoch, which pruning cannot promise; set sweep.pruner to 'none', or "
            "runtime.workers to 1")
    if sweep.pruner != "none" and cfg.runtime.launcher != "local":
        raise ConfigError(
            f"sweep.pruner is {sweep.pruner!r} but runtime.launcher is "
            f"{cfg.runtime.launcher!r}: a trial's pods train without reporting to the "
            "study, so nothing would be pruned; set sweep.pruner to 'none', or "
            "runtime.launcher to 'local'")
    if sweep.pruner == "hyperband" and "fit.epochs" in sweep.params:
        raise ConfigError(
            "sweep.space searches fit.epochs but sweep.pruner is 'hyperband', whose "
            "largest budget is fit.epochs: set fit.epochs and leave it out of the space, "
            "or set sweep.pruner to 'median' or 'none'")


def _fields(cfg: Any) -> dict[str, tuple[str, dataclasses.Field]]:
    """``section.field`` -> (section, field) for every field of every section of ``cfg``."""
    found = {}
    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(type(getattr(cfg, section.name))):
            found[f"{section.name}.{f.name}"] = (section.name, f)
    return found


def _searchable(fields: dict[str, tuple[str, dataclasses.Field]]) -> list[str]:
    return [path for path, (section, f) in fields.items()
            if _refusal(path, section, f) is None]


def _refusal(path: str, section: str, f: dataclasses.Field) -> str | None:
    if section in REFUSED_SECTIONS:
        return REFUSED_SECTIONS[section]
    if f.metadata.get("deployment"):
        return "it is a deployment setting (where the run's files and models live)"
    if path == "model.args":
        return "search the model's arguments one by one, as model.args.<name>"
    return REFUSED.get(path)


def _check_field(path: str, param: Param,
                 fields: dict[str, tuple[str, dataclasses.Field]]) -> None:
    if path not in fields:
        close = difflib.get_close_matches(path, list(fields), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"sweep.space: unknown field {path!r}{hint}; fields that may be searched: "
            + ", ".join(_searchable(fields)) + ", model.args.<name>")
    section, f = fields[path]
    why = _refusal(path, section, f)
    if why:
        raise ConfigError(f"sweep.space: {path} cannot be searched: {why}")
    kind, is_list = field_type(f)
    json_type = "array" if is_list else JSON_TYPES[kind]
    _check_kind(param, json_type)
    for value in param.values_to_check():
        try:
            check_value(section, f, value)
        except ConfigError as exc:
            raise ConfigError(f"{param.where}: {exc}") from None


def _check_model_arg(cfg: Any, param: Param) -> None:
    name = param.path.removeprefix("model.args.")
    model = cfg.model.name
    builder = resolve(model)
    declared = parameters(model, builder)
    if name not in declared:
        listed = ", ".join(f"model.args.{k}" for k in declared) or "none"
        raise ConfigError(f"sweep.space: {param.path} is not an argument of model {model!r}; "
                          f"its arguments: {listed}")
    _check_kind(param, JSON_TYPES[declared[name].kind])
    for value in param.values_to_check():
        try:
            check_args(model, builder, {name: value})
        except ConfigError as exc:
            raise ConfigError(f"{param.where}: {exc}") from None


def _check_kind(param: Param, json_type: str) -> None:
    """Which distributions a field of ``json_type`` takes (``TAKES``)."""
    if json_type not in TAKES[param.kind]:
        takes = [kind for kind, types in TAKES.items() if json_type in types]
        allowed = (" or ".join(repr(k) for k in takes) if takes
                   else "nothing: a list or object field cannot be searched")
        raise ConfigError(f"{param.where} is {param.kind!r} {shown(param.spec())} but the "
                          f"field is {'an' if json_type[0] in 'aeiou' else 'a'} {json_type}; "
                          f"it takes {allowed}")
