"""The cluster account's ECR registry endpoint for image bytes: Debian's ``docker-registry``.

moto answers ECR's API (``CreateRepository``, ``GetAuthorizationToken``, …) but not the
image protocol a puller speaks (``/v2/<name>/manifests/<reference>``, ``/v2/<name>/blobs/
<digest>``), so the emulator runs the real registry (distribution 2.8, the code behind
Docker Hub's registry) as a process on a loopback address: what ``podman pull`` and
``skopeo copy`` reach in place of ``<account>.dkr.ecr.<region>.amazonaws.com``. Its content
lives in a directory of the emulator's (the registry's filesystem driver); the process leads
its own process group and goes with one ``killpg``.

What differs from ECR (docs/emulator.md, "Container images"): plain HTTP on loopback
(ECR speaks only HTTPS; the emulated node's podman is told the address is insecure), no
authentication (ECR wants the token of ``GetAuthorizationToken`` as basic credentials
``AWS:<token>``, 12 hours valid; this registry takes anyone), no repository policy or
IAM check on a pull, no tag immutability, no image scanning, repositories created on the
first push (ECR refuses a push to a repository that was not created). moto's ECR and this
registry do not share state: an image pushed here is not listed by moto's
``DescribeImages``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.node.procgroup import stop_popen_group
from emulator.cloud import free_port

#: Debian's package ``docker-registry`` (scripts/system-deps.sh installs it).
REGISTRY_BINARY = "docker-registry"
START_TIMEOUT = 20.0


class RegistryError(RuntimeError):
    """The registry could not be started; the message says why (its log's tail included)."""


def config(address: str, port: int, storage: Path) -> str:
    """The registry's configuration (YAML; JSON is YAML): filesystem storage under
    ``storage``, listening on ``address:port`` only, deletes allowed (a test cleans up),
    no health poller (nothing reads it) and warnings only in its log."""
    return json.dumps({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)},
                    "delete": {"enabled": True}},
        "http": {"addr": f"{address}:{port}", "secret": "emulated-registry"},
    }, indent=2)


@dataclass
class Registry:
    """One registry process; ``endpoint`` is ``host:port``, the reference's registry part."""

    state_dir: Path
    address: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "registry.log"

    def start(self) -> Registry:
        """Start the process and wait until ``GET /v2/`` answers (the protocol's ping)."""
        binary = shutil.which(REGISTRY_BINARY)
        if binary is None:
            raise RegistryError(f"{REGISTRY_BINARY} is not installed (scripts/system-deps.sh)")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.address)
        conf = self.state_dir / "registry.yml"
        conf.write_text(config(self.address, self.port, self.state_dir / "storage"))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([binary, "serve", str(conf)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://{self.endpoint}/v2/", timeout=2):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        tail = self.log_path.read_text(errors="replace")[-800:]
        self.stop()
        raise RegistryError(f"the registry at {self.endpoint} did not answer: {tail}")

    def stop(self) -> None:
        """Stop the process group (idempotent)."""
        if self.proc is not None and self.proc.returncode is None:
            stop_popen_group(self.proc)
        self.proc = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
