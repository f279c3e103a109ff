"""Drill: a job's environment and argv never reach a process that runs as root.

The executors start every process of a job's share under a root wrapper (it records the
exit status). A REAL unprivileged user submits jobs whose environment holds every variable
that makes a loader, the C library, a shell or an interpreter load or run something of its
choosing (``LD_PRELOAD``, ``LD_AUDIT``, ``GCONV_PATH``, ``PYTHONPATH``, ``BASH_ENV``, ...),
through every submit path: ``dl-run --unmanaged`` (``each`` and torchrun) and a managed job
through the root job controller. The planted library writes a marker as it loads, saying
whether it ran as root; a Python ``sitecustomize`` and a ``BASH_ENV`` script do the same.
While each job runs, every process of the machine is looked at (``tests/support/
proc_watch.py``): no process with a uid of 0 may ever hold one of the planted values in
its ``/proc/<pid>/environ`` or its ``/proc/<pid>/cmdline``, no marker may say root, and
the job itself (as the user) must have had them all.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.security.conftest import dl
from tests.support.cluster import free_rdzv_port
from tests.support.proc_watch import ProcWatch, watching

pytestmark = [pytest.mark.slow]

#: Loaded by LD_PRELOAD (its constructor) and by LD_AUDIT (``la_version``): a marker
#: ``<root|user>-<how>-<pid>`` in MARKERS.
PROBE_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
static void mark(const char *how) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s-%s-%d", MARKERS,
             (getuid() == 0 || geteuid() == 0) ? "root" : "user", how, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) close(fd);
}
__attribute__((constructor)) static void loaded(void) { mark("preload"); }
unsigned int la_version(unsigned int version) { mark("audit"); return version; }
"""
SITECUSTOMIZE = """
import os
_who = "root" if 0 in (os.getuid(), os.geteuid()) else "user"
open(os.path.join({markers!r}, f"{{_who}}-python-{{os.getpid()}}"), "a").close()
"""
SHELL_PROBE = """
if [ "$(id -u)" = 0 ]; then : > "{markers}/root-shell-$$"; else : > "{markers}/user-shell-$$"; fi
"""
#: The job: print the environment it was started with (the shell's own ``env`` would not
#: show IFS), live long enough to be looked at.
SHELL_JOB = "tr '\\0' '\\n' < /proc/$$/environ; echo; sleep 3"
PYTHON_JOB = """
import os, time
print("\\n".join(f"{k}={v}" for k, v in os.environ.items()), flush=True)
time.sleep(3)
"""
#: Variables that would break the job's own interpreter (as the user, which is theirs to
#: do): planted in the jobs that run no Python of the user's.
NOT_FOR_PYTHON = ("PYTHONHOME", "PYTHONINSPECT", "OPENSSL_CONF", "TMPDIR")


def build_probes(d: Path, tag: str) -> dict[str, str]:
    """The probes in ``d`` (every user can read them) and every variable to plant, each
    value holding ``tag``."""
    markers = d / "markers"
    markers.mkdir(mode=0o777)
    os.chmod(markers, 0o1777)
    lib_dir = d / f"lib-{tag}"
    lib_dir.mkdir()
    source = d / "probe.c"
    source.write_text(PROBE_C)
    lib = lib_dir / "libdrill.so"
    built = subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(source),
                            f'-DMARKERS="{markers}"'], capture_output=True, text=True,
                           timeout=120)
    assert built.returncode == 0, built.stderr
    py_dir = d / f"py-{tag}"
    py_dir.mkdir()
    (py_dir / "sitecustomize.py").write_text(SITECUSTOMIZE.format(markers=str(markers)))
    shell = d / f"probe-{tag}.sh"
    shell.write_text(SHELL_PROBE.format(markers=markers))
    for path in (d, lib_dir, py_dir, lib, py_dir / "sitecustomize.py", shell):
        os.chmod(path, 0o755)
    return {
        "LD_PRELOAD": str(lib), "LD_AUDIT": str(lib), "LD_LIBRARY_PATH": str(lib_dir),
        "LD_DEBUG_OUTPUT": f"{d}/debug-{tag}", "LD_PROFILE": f"lib{tag}.so",
        "LD_PROFILE_OUTPUT": f"{d}/profile-{tag}", "LD_ORIGIN_PATH": f"{d}/origin-{tag}",
        "GCONV_PATH": f"{d}/gconv-{tag}", "LOCPATH": f"{d}/locale-{tag}",
        "NLSPATH": f"{d}/nls-{tag}/%N", "HOSTALIASES": f"{d}/hosts-{tag}",
        "RES_OPTIONS": f"ndots:1 {tag}", "LOCALDOMAIN": tag, "TZDIR": f"{d}/tz-{tag}",
        "MALLOCOPTIONS": tag, "MALLOC_TRACE": f"{d}/mtrace-{tag}",
        "GLIBC_TUNABLES": f"{tag}=1:glibc.malloc.check=0",
        "PYTHONPATH": f"{py_dir}:{REPO_ROOT}", "PYTHONHOME": f"{d}/home-{tag}",
        "PYTHONSTARTUP": f"{d}/startup-{tag}.py", "PYTHONUSERBASE": f"{d}/user-{tag}",
        "PYTHONINSPECT": tag, "PYTHONBREAKPOINT": f"{tag}.hook",
        "BASH_ENV": str(shell), "ENV": str(shell), "PERL5OPT": f"-M{tag}",
        "PERL5LIB": f"{d}/perl-{tag}", "PERLLIB": f"{d}/perl-{tag}", "RUBYOPT": f"-r{tag}",
        "RUBYLIB": f"{d}/ruby-{tag}", "NODE_OPTIONS": f"--require {d}/node-{tag}.js",
        "NODE_PATH": f"{d}/node-{tag}", "OPENSSL_CONF": f"{d}/openssl-{tag}.cnf",
        "OPENSSL_ENGINES": f"{d}/engines-{tag}", "TMPDIR": f"{d}/tmp-{tag}",
        "IFS": f" {tag}", "PATH": f"{d}/bin-{tag}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }


def env_options(env: dict[str, str]) -> list[str]:
    return [arg for name, value in env.items() for arg in ("--env", f"{name}={value}")]


def markers(d: Path) -> list[str]:
    return sorted(p.name for p in (d / "markers").iterdir())


@pytest.fixture()
def drill(shared_tmp):
    tag = f"dldrill{secrets.token_hex(6)}"
    d = shared_tmp / f"env-{tag}"
    d.mkdir()
    return d, tag, build_probes(d, tag)


def submit(c, victim, tag: str, *args: str) -> tuple[int, str, list]:
    """``dl-run`` as the victim while every process is watched; (rc, output, the root
    processes seen holding the tag in their environment or command line)."""
    with watching(ProcWatch(tag.encode(), uid=0)) as watch:
        rc, out = dl(c, victim, "dl-run", *args)
    assert watch.passes > 10, watch.passes  # it did look while the job ran
    return rc, out, sorted((s for s in watch.seen if 0 in s.uids), key=lambda s: s.pid)


def test_no_root_process_ever_runs_with_the_jobs_environment_or_argv(cluster, victim, drill):
    c = cluster
    d, tag, env = drill
    shell_job = ["--", "/bin/sh", "-c", SHELL_JOB, f"{tag}-argv"]
    python_env = {k: v for k, v in env.items() if k not in NOT_FOR_PYTHON}
    script = d / "job.py"
    script.write_text(PYTHON_JOB)
    script.chmod(0o644)
    python_job = ["--", "python", str(script), f"{tag}-argv"]
    paths = {
        "unmanaged each": ["--unmanaged", "--launcher", "each", *env_options(env),
                           *shell_job],
        "managed each": ["--launcher", "each", *env_options(env), *shell_job],
        "unmanaged torchrun": ["--unmanaged", "--rdzv-port", free_rdzv_port(c),
                               *env_options(python_env), *python_job],
    }
    for path, args in paths.items():
        rc, out, seen_as_root = submit(c, victim, tag, *args)
        assert rc == 0, (path, out + c.controller_log())
        found = markers(d)
        ran_as_root = [m for m in found if m.startswith("root-")]
        assert (seen_as_root, ran_as_root) == ([], []), path
        # the job (the user's) had them all (a managed attempt adds to PYTHONPATH)
        planted = python_env if "torchrun" in path else env
        missing = [k for k in planted if not re.search(rf"\] {k}=.*{tag}", out)]
        assert missing == [], (path, missing, out)
        assert any(m.startswith("user-preload-") for m in found), (path, found)
    assert any(m.startswith("user-python-") for m in markers(d))  # the user's Python loaded it
