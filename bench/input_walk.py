"""Issue 42's walk: how many times the staged dataset, followed from ``fit.train``, enters
a module of ``training.data`` that it has already left.

Why: the count says whether training asks the input for its splits once and a backend's
reader then does the work, or whether the dataset goes back and forth between modules;
counted on a real run, not read off the code. The offline ``digits`` are staged here
with their decoded copy; then ``training.train.fit.train`` runs the seed's mlp once per
Keras backend and ``dataset.decoded_copy`` (each run in a process of its own: one
backend a process), traced with ``sys.setprofile`` until Keras's ``fit`` starts.

A hop is a call from a function of one module into a function of another module of
``training.data`` (the caller: the nearest frame of ``training.data`` or of ``fit``;
code outside passes through; module code and generator resumes are not hops) that hands
the dataset over: an argument other than ``self`` is the ``StagedDataset``, its
directory, the reader of its files (a tfds builder, ``StagedArrays``, any ``*Reader``),
a split's ``DecodedSplit`` or ``DeviceSplit``, or a split's images as one 4-d array. A
re-entry (``*``) is a hop into a module that had a hop before. It imports only ``fit``,
the config and the stage step, so it runs on either layout of ``training.data`` (run
it with ``PYTHONPATH`` at another checkout to count that one's).

    .venv/bin/python bench/input_walk.py [--target 2]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CARRIERS = {"StagedDataset", "StagedArrays", "DecodedSplit", "DeviceSplit"}
RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
CASES = [(b, d) for b in ("tensorflow", "jax") for d in (False, True)]


def carried(value: object, directory: str) -> bool:
    """Whether ``value`` is the staged dataset in one of its forms (see the module doc)."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value) == directory
    kind = type(value)
    if kind.__name__ in ("ndarray", "memmap"):
        return getattr(value, "ndim", 0) == 4
    return (kind.__name__ in CARRIERS or kind.__name__.endswith("Reader")
            or any(k.__module__.startswith("tensorflow_datasets") for k in kind.__mro__[:-1]))


def walk(backend: str, staged_file: str, decoded: bool) -> list[str]:
    """The hops of one run, each ``module(function)``, a re-entry marked ``*``."""
    from training import backend as keras_backend

    keras_backend.use(backend)
    import keras

    from training.config import RunConfig
    from training.train import fit

    staged = fit.StagedDataset.from_dict(json.loads(Path(staged_file).read_text()))
    cfg = RunConfig.from_flat({"staging_dir": staged.staging_dir, "epochs": 1,
                               "output_dir": str(Path(staged_file).parent / "runs"),
                               "backend": backend, "decoded_copy": decoded})
    hops, seen, stack, started = [], set(), [], {}

    def profile(frame, event, arg):
        code, module = frame.f_code, frame.f_globals.get("__name__", "")
        if event == "return" and stack and stack[-1][0] is frame:
            stack.pop()
        if event != "call":
            return
        if module.startswith("keras") and code.co_name == "fit":
            sys.setprofile(None)  # the walk ends where Keras takes the splits
        if not (module.startswith("training.data") or module == fit.__name__):
            return
        resumed = id(frame) in started
        if code.co_flags & RESUMABLE:
            started[id(frame)] = frame  # held: no id is reused while the run is traced
        count = code.co_argcount + code.co_kwonlyargcount
        values = [frame.f_locals.get(n) for n in code.co_varnames[:count] if n != "self"]
        if code.co_flags & inspect.CO_VARARGS:  # *args: each one
            values += list(frame.f_locals.get(code.co_varnames[count]) or ())
        caller = stack[-1][1] if stack else None
        if (not resumed and caller not in (None, module) and code.co_name != "<module>"
                and any(carried(v, staged.path) for v in values)):
            name = module.removeprefix("training.data.")
            hops.append(f"{name}{'*' if name in seen else ''}({code.co_qualname})")
            seen.add(name)
        stack.append((frame, module))

    class Walked(Exception):
        pass

    class Stop(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            raise Walked

    sys.setprofile(profile)
    try:
        fit.train(cfg, staged, extra_callbacks=[Stop()])
    except Walked:
        pass
    finally:
        sys.setprofile(None)
    return hops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, default=2, help="re-entries allowed")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        backend, staged_file, decoded = args.child
        print(json.dumps(walk(backend, staged_file, decoded == "1")))
        return 0
    import training
    from training.config import RunConfig
    from training.steps.stage import stage

    print(f"training from {Path(training.__file__).parent}", flush=True)
    worst = 0
    with tempfile.TemporaryDirectory(prefix="bench-walk-") as tmp:
        staged = stage(RunConfig.from_flat({"staging_dir": tmp, "decoded_copy": True}))
        staged_file = Path(tmp) / "staged.json"
        staged_file.write_text(json.dumps(staged.to_dict()))
        for backend, decoded in CASES:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", backend, str(staged_file),
                 "1" if decoded else "0"], capture_output=True, text=True,
                env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if proc.returncode:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            hops = json.loads(proc.stdout.strip().splitlines()[-1])
            again = sum("*(" in hop for hop in hops)
            worst = max(worst, again)
            print(f"\n{backend}, decoded_copy {str(decoded).lower()}: {again} re-entries\n"
                  "  fit -> " + "\n    -> ".join(hops), flush=True)
    print(f"\nre-entries, the most of any case: {worst} (target: at most {args.target})")
    return 0 if worst <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
