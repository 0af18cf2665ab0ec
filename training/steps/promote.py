"""Step 6, promote: the production pointer moved to the published version, if it won.

The decision is the one published with the version (not a local file that may have
changed since); the pointer (``training.registry.pointer``) moves with a conditional
write, only if production is still the champion the decision was made against, and the
promotion history records it. Already done for this run? A version already in
production is a no-op.
"""

from __future__ import annotations

import logging
from typing import Any

from training.config import RunConfig
from training.errors import RegistryError
from training.registry.versions import ModelRegistry
from training.steps.evaluate import published_evaluation

log = logging.getLogger(__name__)


def promote(cfg: RunConfig, registry: ModelRegistry, *, at: str,
            published: dict[str, Any] | None = None,
            approval: dict[str, Any] | None = None) -> dict[str, Any]:
    """Move the production pointer to the published version when the decision says so.

    ``published`` is what ``publish`` returned (Airflow hands it over through XCom);
    without it, this run's version. ``approval``: a person's approval (``by``,
    ``reason``), recorded in the history. Returns ``{"promoted": bool, "reasons":
    [...], "previous": ..., ...}``.
    """
    name, version = cfg.model_name, cfg.run_id
    if published is not None:
        if published.get("model_name") != name:
            raise RegistryError(f"publish handed over model {published.get('model_name')!r}, "
                                f"but this run's model is {name!r}")
        version = published["version"]
    evaluation = published_evaluation(cfg, registry, version)
    if evaluation is None:
        raise RegistryError(f"model {name!r} version {version!r} is not "
                            "published: publish it before promoting")
    decision = evaluation["decision"]
    result = {"model_name": name, "version": version,
              "promoted": False, "forced": decision["forced"], "reasons": decision["reasons"]}
    if not decision["promote"]:
        log.info("%s %s is not promoted: %s", name, version, "; ".join(decision["reasons"]))
        return result
    champion = evaluation["champion"]
    reasons, by = list(decision["reasons"]), None
    if approval and approval.get("approved"):
        by = approval.get("by")
        reasons.append(f"approved by {by}: {approval.get('reason')}")
    previous = champion["version"] if champion else None
    registry.promote(name, version, run_id=cfg.run_id, at=at, reason="; ".join(reasons),
                     forced=decision["forced"], expected_current=previous, by=by)
    log.info("%s %s is now in production", name, version)
    return {**result, "promoted": True, "reasons": reasons, "previous": previous, "by": by}
