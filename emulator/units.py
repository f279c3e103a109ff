"""What systemd does with the units the real installer writes, on an emulated node.

The installer (``bootstrap_scripts.agent.install``, run with ``--no-systemctl``) writes the
node's unit files under its root; the emulator has no systemd, so ``emulator.nodes`` starts
each unit's process itself from what is read here, as systemd would read it:

- ``ExecStart=`` (argv, ``%%`` and ``$$`` unescaped), ``Environment=`` and
  ``EnvironmentFile=`` (:func:`unit_exec`, :func:`environment_file`: a missing file fails the
  unit unless its path starts with ``-``);
- ``StandardOutput=append:<path>`` (:func:`unit_output`), the file the process writes to;
- ``Restart=``, ``RestartSec=``, ``RestartPreventExitStatus=`` (:func:`restart_policy`):
  whether a unit whose process ended is started again, and when
  (``emulator.nodes.Node.restart_units``).

Reading the installer's own files, rather than knowing the commands, is the drift check: a
unit that would not start under systemd does not start here either.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

AGENT_UNIT = "etc/systemd/system/dl-agent.service"
EXECUTOR_UNIT = "etc/systemd/system/dl-executor.service"
CONTROLLER_UNIT = "etc/systemd/system/dl-controller.service"  # the master's only


class NodeError(RuntimeError):
    """A node could not boot; the message names the node and what failed."""


_UNIT_ESCAPES = re.compile(r"%%|\$\$")


def environment_file(path: str, unit: str) -> dict[str, str]:
    """``KEY=value`` lines of a unit's ``EnvironmentFile=`` (``-path``: may be missing), as
    systemd reads them; a missing file fails the unit, as systemd fails it."""
    optional = path.startswith("-")
    try:
        text = Path(path.removeprefix("-")).read_text()
    except OSError as exc:
        if optional:
            return {}
        raise NodeError(f"{unit}: EnvironmentFile {path} cannot be read: {exc}") from None
    env = {}
    for line in text.splitlines():
        line = line.strip()
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", ";")):
            env[key.strip()] = value.strip().strip('"')
    return env


def unit_exec(unit_text: str, unit: str) -> tuple[list[str], dict[str, str]]:
    """``ExecStart`` argv and environment (``Environment=``, ``EnvironmentFile=``) of a unit
    written by the installer."""
    argv: list[str] | None = None
    env: dict[str, str] = {}
    for line in unit_text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "EnvironmentFile":  # a bare path, "%%" for "%", as systemd reads it
            env.update(environment_file(value.strip().replace("%%", "%"), unit))
        elif key == "ExecStart":
            argv = [_UNIT_ESCAPES.sub(lambda m: m.group(0)[0], a) for a in shlex.split(value)]
        elif key == "Environment":
            for item in shlex.split(value):
                k, _, v = item.partition("=")
                env[k] = v
    if not argv:
        raise NodeError(f"{unit} has no ExecStart line")
    return argv, env


@dataclass(frozen=True)
class RestartPolicy:
    """A unit's ``Restart=``, ``RestartSec=`` and ``RestartPreventExitStatus=``."""

    restart: str = "no"
    seconds: float = 0.1  # systemd's default RestartSec
    prevent: frozenset[int] = frozenset()

    def wants(self, returncode: int) -> bool:
        """Does systemd start the unit again after its process ended with ``returncode``
        (negative: killed by that signal, a failure to systemd)?"""
        if returncode in self.prevent:
            return False
        return self.restart == "always" or (self.restart == "on-failure" and returncode != 0)


def unit_output(unit_text: str) -> str:
    """The file of a unit's ``StandardOutput=append:<path>`` ("" when it has none), which
    systemd opens for appending before it starts the process."""
    for line in unit_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "StandardOutput" and value.startswith("append:"):
            return value.removeprefix("append:").replace("%%", "%")
    return ""


def restart_policy(unit_text: str) -> RestartPolicy:
    values = dict(line.partition("=")[::2] for line in unit_text.splitlines() if "=" in line)
    return RestartPolicy(values.get("Restart", "no").strip(),
                         float(values.get("RestartSec", "0.1").strip().rstrip("s") or 0.1),
                         frozenset(int(v) for v in values.get("RestartPreventExitStatus",
                                                              "").split() if v.isdigit()))
