"""A tiny OCI image built from what is on this machine, never fetched.

The image's root holds the host's ``dash`` (as ``/bin/sh``) and a few coreutils with the
shared libraries ``ldd`` names for them: about 3 MB, enough for a test to see who runs
inside, where it is and what a mounted file holds. It is written as an OCI image layout
(``oci-layout``, ``index.json``, ``blobs/sha256/…``: one gzip layer, its config, its
manifest) by hand, so no build tool and no network are needed; ``skopeo copy oci:DIR
docker://REGISTRY/REPO:TAG`` then pushes it like any image.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import tarfile
from pathlib import Path

#: The host programs copied in (each under /bin), with the libraries they load.
PROGRAMS = ("/bin/dash", "/usr/bin/id", "/bin/cat", "/bin/pwd", "/bin/ls")
_LIBRARY = re.compile(r"(/\S+)")


def _libraries(program: str) -> set[str]:
    """The absolute paths ``ldd`` lists for ``program`` (its loader included)."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    return {m.group(1) for line in out.splitlines() if (m := _LIBRARY.search(line))}


def _add(tar: tarfile.TarFile, source: str, name: str) -> None:
    data = Path(source).read_bytes()  # follows symlinks: the image gets the file itself
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size, info.mode, info.mtime = len(data), 0o755, 0
    tar.addfile(info, io.BytesIO(data))


def _layer() -> bytes:
    """The root file system as an uncompressed tar (deterministic: mtime 0, root-owned)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if directory == "tmp" \
                else 0o755, 0
            tar.addfile(info)
        libraries: set[str] = set()
        for program in PROGRAMS:
            _add(tar, program, "bin/" + Path(program).name)
            libraries |= _libraries(program)
        for library in sorted(libraries):
            parent = ""
            for part in Path(library).parent.parts[1:]:
                parent += part + "/"
                if parent.rstrip("/") not in tar.getnames():
                    info = tarfile.TarInfo(parent.rstrip("/"))
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            _add(tar, library, library)
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "dash", 0
        tar.addfile(link)
    return buf.getvalue()


def _blob(layout: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / digest).write_bytes(data)
    return "sha256:" + digest


def build_layout(layout: Path) -> str:
    """Write the image as an OCI layout at ``layout``; returns its manifest's digest."""
    (layout / "blobs/sha256").mkdir(parents=True, exist_ok=True)
    tar = _layer()
    layer = gzip.compress(tar, mtime=0)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _blob(layout, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _blob(layout, layer), "size": len(layer)}],
    }, sort_keys=True).encode()
    digest = _blob(layout, manifest)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}))
    return digest


def push(layout: Path, destination: str) -> str:
    """``skopeo copy`` the layout to ``docker://destination`` (plain HTTP: the emulated
    registry); returns the digest the registry stored the manifest under."""
    digest_file = layout / "pushed-digest"
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--digestfile",
                    str(digest_file), f"oci:{layout}:latest", f"docker://{destination}"],
                   check=True, capture_output=True, timeout=120)
    return digest_file.read_text().strip()


def stop_processes_of(uid: int) -> None:
    """SIGKILL each process of ``uid`` by its pid: rootless podman leaves a pause process
    (``catatonit -P``) holding the user's namespaces, which would outlive a test (and keep
    ``userdel`` from removing the user)."""
    found = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True,
                           check=False).stdout.split()
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
