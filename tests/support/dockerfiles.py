"""docker/'s files read as Docker and Compose read them, for the tests that check them.

Why: tests/unit/test_docker.py checks the compose files and Dockerfiles without an
engine, and tests/support/compose.py makes an env file from docker/.env.example; both
need Compose's variable interpolation and a Dockerfile's instructions, stages and ARG
defaults, parsed the same way. Only what those files use is supported (no parser
directives, no heredocs).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(Exception):
    """A ``${VAR:?...}`` or ``${VAR?...}`` without its variable."""


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err},
    ${VAR?err}; ``$$`` is a literal ``$``."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        present, val = name in env, env.get(name, "")
        if op == ":-":
            return val if val else arg
        if op == "-":
            return val if present else arg
        if op in (":?", "?") and (not present or (op == ":?" and not val)):
            raise MissingVariable(f"{name}: {arg}")
        return val

    parts = value.split("$$")
    return "$".join(REFERENCE.sub(one, part) for part in parts)


def walk_strings(node: Any, path: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk_strings(value, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def env_example() -> dict[str, str]:
    """docker/.env.example's variables and values."""
    values = {}
    for line in (DOCKER / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


# --------------------------------------------------------------- Dockerfile helpers


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.strip().partition(" ")
        result.append((keyword.upper(), rest.strip()))
        current = ""
    return result


def exec_form(args: str) -> list[str]:
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def stages(dockerfile: Path) -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """(image with the global ARG defaults substituted, alias, instructions) a stage."""
    args: dict[str, str] = {}
    found: list[tuple[str, str | None, list[tuple[str, str]]]] = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG" and not found:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            image = interpolate(words[0], args)
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append((image, alias, []))
        elif found:
            found[-1][2].append((keyword, rest))
    return found


def stage(dockerfile: Path, alias: str) -> list[tuple[str, str]]:
    """The instructions of ``alias`` and of the stages it is built FROM."""
    by_alias = {a: (image, body) for image, a, body in stages(dockerfile)}
    image, body = by_alias[alias]
    return (stage(dockerfile, image) if image in by_alias else []) + body


def arg_default(dockerfile: Path, name: str) -> str | None:
    defaults = [rest.partition("=")[2] for keyword, rest in instructions(dockerfile)
                if keyword == "ARG" and rest.partition("=")[0] == name and "=" in rest]
    return defaults[0] if defaults else None


def pinned(image: str) -> bool:
    """A digest, or a tag that is neither empty nor ``latest``."""
    if "@sha256:" in image:
        return True
    name = image.rsplit("/", 1)[-1]
    if ":" not in name:
        return False
    tag = name.split(":", 1)[1]
    return bool(tag) and tag != "latest" and "$" not in tag


def copy_sources(dockerfile: Path) -> list[str]:
    """What COPY/ADD take from the context, and RUN's ``--mount=type=bind`` sources."""
    sources = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "RUN":
            sources += re.findall(r"--mount=type=bind,source=([^,\s]+)", rest)
        if keyword not in ("COPY", "ADD"):
            continue
        words = exec_form(rest) if rest.startswith("[") else rest.split()
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from=") for f in flags) or any("<<" in w for w in words):
            continue  # from another stage or a heredoc: nothing from the context
        paths = [w for w in words if not w.startswith("--")]
        assert len(paths) >= 2, f"{dockerfile.name}: {keyword} {rest!r} needs src and dest"
        sources.extend(paths[:-1])
    return sources


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore ``patterns`` exclude ``path`` (last matching rule wins)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.strip("/")
        if any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.replace("**/", ""))
               for p in prefixes):
            verdict = not negate
    return verdict


def dockerignore(dockerfile: Path) -> list[str]:
    path = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
