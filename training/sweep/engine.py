"""What Optuna searches with: the objective's direction, the sampler, the pruner, the
distributions; each from the sweep's config.

Each trial task is its own process with its own sampler, so a sampler seeded with
``sweep.seed`` alone would draw the same values in every parallel trial. ``trial_seed``
seeds each trial's draw by the sweep's seed, the run id and the trial's slot: trials
differ, nights differ, and a retried trial draws what its first attempt drew.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import optuna

from training.config.sections import monitor_rises as maximize  # accuracy up, loss down
from training.sweep.space import Param

optuna.logging.set_verbosity(optuna.logging.WARNING)  # steps.sweep logs what a sweep does

MEDIAN_MAX_STARTUP = 5  # completed trials before median pruning starts (fewer in small sweeps)
MEDIAN_WARMUP_SHARE = 5  # the first 1/5 of the epochs (at least one) are never pruned
HYPERBAND_REDUCTION = 3  # hyperband keeps the best third at each rung
TPE_MAX_STARTUP = 10  # random trials before TPE models the results (fewer in small sweeps)


def direction(monitor: str) -> str:
    return "maximize" if maximize(monitor) else "minimize"


def trial_seed(seed: int, run_id: str, slot: int) -> int:
    """The seed of slot ``slot``'s draw (module doc)."""
    digest = hashlib.sha256(f"{seed}:{run_id}:{slot}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def make_sampler(sampler: str, trials: int, seed: int) -> optuna.samplers.BaseSampler:
    """The sampler of one trial's draw. A grid's points are given to the slots when the
    sweep is planned (``study.plan``: each slot's trial is enqueued with its point), so
    no sampler draws a grid trial's values; Optuna's ``GridSampler`` would hand points
    out by trial number, which is not the slot."""
    if sampler == "tpe":
        # constant_liar: trials still running count as bad, so parallel trials spread out
        startup = max(2, min(TPE_MAX_STARTUP, trials // 3))
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup,
                                          constant_liar=True)
    return optuna.samplers.RandomSampler(seed=seed)


def make_pruner(pruner: str, trials: int, epochs: int) -> optuna.pruners.BasePruner:
    """none: never; median: below the completed trials' median at the same epoch, once
    a few trials completed and after the first fifth of the epochs (at least the first
    epoch: one epoch's value alone is too noisy to judge a trial by); hyperband: successive
    halving over budgets from 1 epoch to ``epochs`` (the step reported is the epochs done)."""
    if pruner == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=max(1, min(MEDIAN_MAX_STARTUP, trials // 4)),
            # Optuna prunes from the step n_warmup_steps on; the step is the epochs done.
            n_warmup_steps=max(1, epochs // MEDIAN_WARMUP_SHARE) + 1)
    if pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs,
                                              reduction_factor=HYPERBAND_REDUCTION)
    return optuna.pruners.NopPruner()


def distribution(param: Param) -> optuna.distributions.BaseDistribution:
    """The Optuna distribution of a searched field."""
    if param.kind == "float":
        return optuna.distributions.FloatDistribution(param.low, param.high, log=param.log,
                                                      step=param.step)
    if param.kind == "int":
        return optuna.distributions.IntDistribution(int(param.low), int(param.high),
                                                    log=param.log, step=int(param.step or 1))
    return optuna.distributions.CategoricalDistribution(param.choices)


def distributions(params: Mapping[str, Param]) -> dict[str, Any]:
    return {path: distribution(p) for path, p in sorted(params.items())}
