"""``dl-container pull IMAGE@DIGEST``: the image in the calling user's store before any rank.

Ranks run with ``--pull=never`` (``podman_argv``), so the image must be on the node first:
this is that step, run as the job's user (its rootless store is the one its ranks read) on
every node of the job by the job's runner (``jobs/engine/image_pull.py``). By digest only,
so what is pulled is what was pinned at submit; podman checks the manifest against the
digest. An image already in the store is not fetched again ("present": one pull per node
per digest, whatever the job).

Progress goes to standard output, which is the pull's log on the node and so the job's
runner's output (``dl-jobs logs``, ``dlc logs``): one line per layer as podman starts
copying it, then the layers and bytes of the image and the seconds it took.

podman runs with a fixed environment (:func:`podman_env`): the search path, the user's
identity and home from the password database (where a ``podman login`` keeps its
credentials), ``LC_ALL=C`` (its error lines are the ones :mod:`causes` reads), and nothing
else of the caller's.

A failure exits with its cause's status (:data:`causes.EXIT_OF`: not found, access denied,
disk full, registry unreachable, throttled; 3 for anything else) after one line
``error: dl-container pull IMAGE: CAUSE: podman's line`` on standard error, so the runner
fails the job before any rank starts, as infrastructure, naming the node and the cause.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping

from bootstrap_scripts.containers import causes, podman_argv
from bootstrap_scripts.containers.reference import ImageRef

EXIT_PULL_FAILED = causes.EXIT_OF[causes.OTHER]
PULL_TIMEOUT = 3600
#: The only variables of the caller podman sees (besides those :func:`podman_env` sets).
KEPT = ("PATH", "XDG_RUNTIME_DIR")


def podman_env(environ: Mapping[str, str], uid: int | None = None) -> dict[str, str]:
    """podman's whole environment: ``PATH`` as given, ``XDG_RUNTIME_DIR`` as given when it
    is the user's own, the user's name and home from the password database, the C locale."""
    uid = os.getuid() if uid is None else uid
    env = {k: environ[k] for k in KEPT if environ.get(k)}
    runtime = env.get("XDG_RUNTIME_DIR", "")
    try:  # another user's (root's, when a share inherited it) is of no use and refused
        if os.stat(runtime).st_uid != uid:
            del env["XDG_RUNTIME_DIR"]
    except OSError:
        env.pop("XDG_RUNTIME_DIR", None)
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    try:
        entry = pwd.getpwuid(uid)
        env.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    except KeyError:
        pass
    env["LC_ALL"] = "C"
    return env


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def progress_line(line: str, layers: int) -> tuple[str, int]:
    """podman's line as a progress line ("" to drop it) and the layers counted so far."""
    line = line.strip()
    if line.startswith("Copying blob "):
        layers += 1
        blob = line.removeprefix("Copying blob ").split()[0]
        return f"dl-container: layer {layers}: {blob[:19]}", layers
    if line.startswith("Copying config "):
        return "dl-container: image configuration", layers
    if line.startswith("Writing manifest"):
        return "dl-container: writing the manifest", layers
    return "", layers


def _image_facts(podman: str, ref: str, env: dict[str, str]) -> str:
    """``N layer(s), SIZE`` of the pulled image ("" when podman does not say)."""
    done = subprocess.run([podman, "image", "inspect", "--format",
                           "{{.Size}} {{len .RootFS.Layers}}", ref], check=False, text=True,
                          capture_output=True, env=env, timeout=60)
    try:
        size, layers = (int(x) for x in done.stdout.split())
    except ValueError:
        return ""
    return f"{layers} layer(s), {size_text(size)}"


def pull(image: ImageRef, *, podman: str = podman_argv.PODMAN,
         environ: Mapping[str, str] | None = None) -> int:
    """Pull ``image`` (pinned) unless present; returns the exit status for ``dl-container``."""
    if not image.pinned:
        raise ValueError(f"image {image} is not pinned to a digest")
    ref = image.pinned_name()
    env = podman_env(os.environ if environ is None else environ)
    if subprocess.run([podman, "image", "exists", ref], check=False, env=env,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
        facts = _image_facts(podman, ref, env)
        print(f"dl-container: {ref} present, nothing pulled" + (f" ({facts})" if facts
                                                                 else ""), flush=True)
        return 0
    print(f"dl-container: pulling {ref}", flush=True)
    started = time.monotonic()
    proc = subprocess.Popen([podman, "pull", ref], env=env, text=True, errors="replace",
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    tail: deque[str] = deque(maxlen=20)
    layers = 0
    for line in proc.stderr:
        tail.append(line)
        shown, layers = progress_line(line, layers)
        if shown:
            print(shown, flush=True)
    try:
        code = proc.wait(timeout=PULL_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
        tail.append(f"Error: the pull took more than {PULL_TIMEOUT} s (timeout exceeded)")
    if code != 0:
        text = "".join(tail)
        cause = causes.cause_of(text)
        why = causes.last_error(text) or f"podman exited {code}"
        print(f"error: dl-container pull {ref}: {cause}: {why}", file=sys.stderr, flush=True)
        return causes.EXIT_OF[cause]
    facts = _image_facts(podman, ref, env)
    print(f"dl-container: {ref} pulled in {time.monotonic() - started:.1f} s"
          + (f" ({facts})" if facts else ""), flush=True)
    return 0
