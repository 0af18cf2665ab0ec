"""The Indexed Job that ``training.launch.kubernetes.render`` makes, run as Docker containers.

Why it exists: no Kubernetes cluster is reachable here, yet the rendered pods have to be
shown to work as rendered, in the project's image: the ``exec`` wrapper deriving
``TF_CONFIG`` from ``JOB_COMPLETION_INDEX``, the workers finding each other by their
DNS names, the config read from the ConfigMap's mount, the run written to the shared
volume. ``JobPods`` takes the ConfigMap, headless Service and Indexed Job exactly as
rendered and plays what the cluster would do for them:

* **kubelet**: pod ``i`` is a container of the Job's image (it must exist locally: it is
  never pulled) running the pod's ``command`` (and ``args``) with its ``env``, plus
  ``JOB_COMPLETION_INDEX=i`` as Kubernetes sets it in an Indexed Job; its ``volumeMounts``:
  the ConfigMap's ``data`` written to a host directory and bind-mounted read-only at
  the configMap volume's ``mountPath``, a ``persistentVolumeClaim`` volume a host
  directory (``claims``: claim name -> directory) bind-mounted at its ``mountPath``; the
  memory and CPU ``limits`` as Docker limits. ``valueFrom`` env (Secrets) is refused.
* **cluster DNS**: the containers share a Docker network of their own (``--internal``:
  no route out; an explicit subnet, removed at the end). Docker's embedded DNS
  (127.0.0.11 in each container; it works with the test engine's iptables off) stands in
  for the cluster DNS: pod ``i`` gets ``--hostname <job>-<i>`` and the network alias
  ``<job>-<i>.<service>.<namespace>.svc``, the record a headless Service gives a pod whose
  ``subdomain`` names it. The short forms the cluster's search path adds are not made.
* **Job controller, backoffLimit 0**: every pod starts at once; when one exits non-zero
  the Job has failed: the others are stopped (``docker stop``: SIGTERM, SIGKILL after
  the grace period, as a pod's deletion does) and the result names the pod. A Job
  with ``backoffLimit`` > 0 or created suspended (Kueue) is refused.

``run()`` may be called again: it first removes the previous run's containers, as a
retried Job's pods replace the old ones under the same names. Leaving the ``with``
block removes the containers and the network, whatever happened.
"""

from __future__ import annotations

import itertools
import random
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tools.engine import docker_client

DEFAULT_GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds
_QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


class DockerImages(Protocol):
    """What the harness needs of the session's ``images`` fixture."""

    env: dict[str, str]

    def docker(self, *args: str, check: bool = True, capture: bool = True,
               timeout: float | None = None) -> subprocess.CompletedProcess: ...


@dataclass(frozen=True)
class Pod:
    """One pod of the Job as a container: what ``docker create`` gets."""

    index: int
    hostname: str  # <job>-<i>
    dns_name: str  # <job>-<i>.<service>.<namespace>.svc
    image: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[tuple[str, str, bool], ...]  # host path, mount path, read-only
    memory: int | None  # bytes
    cpus: float | None


@dataclass
class PodResult:
    """How pod ``index`` ended: its exit code (None: it never ran) and everything it printed."""

    index: int
    name: str
    address: str  # its IP address on the Job's network, read while it ran
    exit_code: int | None
    log: str


@dataclass
class JobResult:
    """The Job's outcome: ``succeeded`` when every pod exited 0; else ``failed_pod`` (the
    first pod that failed, None on a timeout) and ``reason`` say why."""

    job: str
    succeeded: bool
    reason: str
    failed_pod: str | None
    pods: list[PodResult]

    @property
    def exit_codes(self) -> dict[str, int | None]:
        return {p.name: p.exit_code for p in self.pods}


def _quantity(value: str) -> float:
    match = _QUANTITY.match(str(value))
    if not match:
        raise ValueError(f"not a Kubernetes quantity this harness reads: {value!r}")
    return float(match[1]) * _FACTORS[match[2]]


def split(objects: Sequence[Mapping[str, Any]]) -> tuple[dict, dict, dict]:
    """The rendered ConfigMap, Service and Job, checked to be what the harness plays."""
    kinds = {o["kind"]: o for o in objects}
    if sorted(kinds) != ["ConfigMap", "Job", "Service"] or len(objects) != 3:
        raise ValueError(f"expected a ConfigMap, a Service and a Job, got {list(kinds)}")
    config_map, service, job = kinds["ConfigMap"], kinds["Service"], kinds["Job"]
    spec = job["spec"]
    pod_spec = spec["template"]["spec"]
    if spec.get("completionMode") != "Indexed" or spec["completions"] != spec["parallelism"]:
        raise ValueError("the harness runs Indexed Jobs whose pods all run at once")
    if spec.get("backoffLimit", 6) != 0 or spec.get("suspend"):
        raise ValueError("the harness plays backoffLimit 0 and an unsuspended Job only")
    if pod_spec.get("subdomain") != service["metadata"]["name"]:
        raise ValueError("the pods' subdomain must name the headless Service")
    if len(pod_spec["containers"]) != 1 or pod_spec.get("initContainers"):
        raise ValueError("the harness runs pods of one container")
    return config_map, service, job


def pods(objects: Sequence[Mapping[str, Any]], claims: Mapping[str, Path],
         config_dir: Path) -> list[Pod]:
    """Every pod of the Job, its ConfigMap volume at ``config_dir`` on the host."""
    config_map, service, job = split(objects)
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", "default")
    pod_spec = job["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    sources: dict[str, tuple[str, bool]] = {}
    for volume in pod_spec.get("volumes", []):
        if "configMap" in volume:
            if volume["configMap"]["name"] != config_map["metadata"]["name"]:
                raise ValueError(f"volume {volume['name']} names another ConfigMap")
            sources[volume["name"]] = (str(config_dir), True)
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if claim not in claims:
                raise ValueError(f"no host directory for the claim {claim!r}")
            sources[volume["name"]] = (str(claims[claim]), False)
        else:
            raise ValueError(f"volume {volume['name']}: only configMap and "
                             "persistentVolumeClaim volumes are played")
    mounts = tuple((sources[m["name"]][0], m["mountPath"],
                    sources[m["name"]][1] or bool(m.get("readOnly")))
                   for m in container.get("volumeMounts", []))
    env: list[tuple[str, str]] = []
    for item in container.get("env", []):
        if "value" not in item:
            raise ValueError(f"env {item['name']}: valueFrom (Secrets) is not played")
        env.append((item["name"], str(item["value"])))
    limits = container.get("resources", {}).get("limits", {})
    memory = int(_quantity(limits["memory"])) if "memory" in limits else None
    cpus = _quantity(limits["cpu"]) if "cpu" in limits else None
    command = (*container["command"], *container.get("args", []))
    service_name = service["metadata"]["name"]
    return [Pod(index=i, hostname=f"{name}-{i}",
                dns_name=f"{name}-{i}.{service_name}.{namespace}.svc",
                image=container["image"], command=command,
                env=(*env, ("JOB_COMPLETION_INDEX", str(i))), mounts=mounts,
                memory=memory, cpus=cpus)
            for i in range(job["spec"]["completions"])]


class JobPods:
    """The rendered Job's pods as containers on a network of their own (a context manager).

    ``images``: the session's ``images`` fixture (``docker(...)`` and ``env``).
    ``objects``: ``render(cfg, options, staged)``'s list. ``claims``: each
    persistentVolumeClaim's host directory. ``workdir``: where the ConfigMap's files go.
    """

    def __init__(self, images: DockerImages, objects: Sequence[Mapping[str, Any]], *,
                 claims: Mapping[str, Path], workdir: Path, prefix: str | None = None) -> None:
        self.images = images
        self.config_map, self.service, self.job = split(objects)
        self.job_name = self.job["metadata"]["name"]
        self.prefix = prefix or f"aktpods-{uuid.uuid4().hex[:8]}"
        self.network = f"{self.prefix}-net"
        self.config_dir = Path(workdir) / f"configmap-{self.config_map['metadata']['name']}"
        self.pods = pods(objects, claims, self.config_dir)
        self.subnet: str | None = None
        self._killed: set[int] = set()

    def container(self, index: int) -> str:
        """The container's name: unique to this harness; the pod's own name is its host."""
        return f"{self.prefix}-{self.pods[index].hostname}"

    # --- setting up and tearing down -----------------------------------------------------

    def __enter__(self) -> JobPods:
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.config_dir.chmod(0o755)
        for key, text in self.config_map["data"].items():
            path = self.config_dir / key
            path.write_text(text)
            path.chmod(0o644)  # a configMap volume's default mode
        self._create_network()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.remove_pods()
        finally:
            self.images.docker("network", "rm", self.network, check=False)

    def _create_network(self) -> None:
        """An internal network on a free /24 of 10.213.0.0/16 (tried until one is free)."""
        thirds = random.sample(range(16, 250), 40)
        for third in thirds:
            subnet = f"10.213.{third}.0/24"
            done = self.images.docker("network", "create", "--internal", "--subnet", subnet,
                                      "--label", f"aktpods={self.prefix}", self.network,
                                      check=False)
            if done.returncode == 0:
                self.subnet = subnet
                return
            if "overlap" not in (done.stderr or "") + (done.stdout or ""):
                raise RuntimeError(f"docker network create failed: {done.stderr}")
        raise RuntimeError("no free /24 subnet in 10.213.0.0/16 for the Job's network")

    def remove_pods(self) -> None:
        """Remove this Job's containers (running or not), as a retried Job replaces its pods."""
        names = [self.container(p.index) for p in self.pods]
        self.images.docker("rm", "--force", "--volumes", *names, check=False)

    # --- running ---------------------------------------------------------------------------

    def kill(self, index: int, signal: str = "KILL") -> None:
        """Send ``signal`` to pod ``index``'s container (a node losing it, or a kill -9)."""
        self._killed.add(index)
        self.images.docker("kill", "--signal", signal, self.container(index), check=False)

    def _create(self, pod: Pod) -> None:
        args = ["create", "--name", self.container(pod.index), "--hostname", pod.hostname,
                "--network", self.network, "--network-alias", pod.dns_name,
                "--label", f"aktpods={self.prefix}", "--entrypoint", pod.command[0]]
        for key, value in pod.env:
            args += ["--env", f"{key}={value}"]
        for host, path, read_only in pod.mounts:
            args += ["--volume", f"{host}:{path}" + (":ro" if read_only else "")]
        if pod.memory is not None:
            args += ["--memory", str(pod.memory)]
        if pod.cpus is not None:
            args += ["--cpus", f"{pod.cpus:g}"]
        self.images.docker(*args, pod.image, *pod.command[1:])

    def _state(self, index: int) -> tuple[str, int, str]:
        """Status, exit code and when it finished (RFC 3339, sorts in time order)."""
        done = self.images.docker(
            "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}",
            self.container(index), check=False)
        status, code, finished = ([*done.stdout.split(), "", "", ""])[:3]
        return status, int(code) if code.lstrip("-").isdigit() else -1, finished

    def _address(self, index: int) -> str:
        done = self.images.docker(
            "inspect", "--format",
            f'{{{{(index .NetworkSettings.Networks "{self.network}").IPAddress}}}}',
            self.container(index), check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    def run(self, *, on_line: Callable[[int, str], None] | None = None,
            timeout_s: float = 900, grace_s: float = DEFAULT_GRACE_S) -> JobResult:
        """Start every pod, follow them until all exit 0 or one fails; the Job's result.

        ``on_line(index, line)`` sees each line a pod prints as it prints it (from the
        thread reading that pod). ``timeout_s`` is a hang guard: past it every pod is
        stopped and the Job reported failed.
        """
        for pod in self.pods:
            found = self.images.docker("image", "inspect", "--format", "{{.Id}}", pod.image,
                                       check=False)
            if found.returncode != 0:  # never pulled: only an image built here runs
                raise RuntimeError(f"image {pod.image} is not in the engine (build it first)")
        self.remove_pods()
        self._killed.clear()
        for pod in self.pods:
            self._create(pod)
        logs: dict[int, list[str]] = {p.index: [] for p in self.pods}
        errors: list[BaseException] = []
        followers = [subprocess.Popen([docker_client(), "start", "--attach",
                                       self.container(p.index)],
                                      env=self.images.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace")
                     for p in self.pods]
        readers = [threading.Thread(target=self._read, args=(i, f, logs[i], on_line, errors),
                                    daemon=True) for i, f in enumerate(followers)]
        for reader in readers:
            reader.start()
        addresses: dict[int, str] = {}
        exit_codes: dict[int, int | None] = {}
        failed: int | None = None
        timed_out = False
        # The Job's activeDeadlineSeconds, when shorter, ends it as Kubernetes would.
        timeout_s = min(timeout_s, self.job["spec"].get("activeDeadlineSeconds") or timeout_s)
        deadline = time.monotonic() + timeout_s
        for tick in itertools.count():
            failures = []
            for pod in self.pods:
                i = pod.index
                if i in exit_codes:
                    continue
                status, code, finished = self._state(i)
                if status == "running" and i not in addresses:
                    addresses[i] = self._address(i)
                never_ran = status == "created" and followers[i].poll() is not None
                if status in ("exited", "dead") or never_ran:  # never_ran: start failed
                    exit_codes[i] = code = code or -1 if never_ran else code
                    if code != 0:
                        failures.append((finished, i))
            if failures and failed is None:
                failed = min(failures)[1]  # the first to fail, when two did at once
            if len(exit_codes) == len(self.pods):
                break
            if failed is not None or time.monotonic() > deadline:
                timed_out = failed is None
                running = [self.container(p.index) for p in self.pods
                           if p.index not in exit_codes]
                self.images.docker("stop", "--time", str(int(grace_s)), *running,
                                   check=False, timeout=grace_s + 60)
                for pod in self.pods:
                    if pod.index not in exit_codes:
                        exit_codes[pod.index] = self._state(pod.index)[1]
                break
            time.sleep(0.2 if tick < 50 else 0.5)
        for follower, reader in zip(followers, readers, strict=True):
            try:
                follower.wait(timeout=60)
            except subprocess.TimeoutExpired:
                follower.kill()
            reader.join(timeout=60)
        if errors:
            raise errors[0]
        results = [PodResult(index=p.index, name=p.hostname, address=addresses.get(p.index, ""),
                             exit_code=exit_codes.get(p.index), log="".join(logs[p.index]))
                   for p in self.pods]
        return self._result(results, failed, timed_out, timeout_s)

    def _result(self, results: list[PodResult], failed: int | None, timed_out: bool,
                timeout_s: float) -> JobResult:
        if timed_out:
            return JobResult(self.job_name, False, f"job {self.job_name} did not finish in "
                             f"{timeout_s:g} s; its pods were stopped", None, results)
        if failed is None:
            return JobResult(self.job_name, True, f"job {self.job_name} succeeded: "
                             f"{len(results)} pods exited 0", None, results)
        pod = results[failed]
        how = " (killed by the test)" if failed in self._killed else ""
        return JobResult(self.job_name, False,
                         f"pod {pod.name} (worker {failed}) failed: exit code "
                         f"{pod.exit_code}{how}; the Job failed (backoffLimit 0) and its other "
                         "pods were stopped", pod.name, results)

    @staticmethod
    def _read(index: int, follower: subprocess.Popen, lines: list[str],
              on_line: Callable[[int, str], None] | None, errors: list[BaseException]) -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            lines.append(line)
            if on_line is not None:
                try:
                    on_line(index, line.rstrip("\n"))
                except BaseException as exc:  # shown by run() in the test's thread
                    errors.append(exc)
