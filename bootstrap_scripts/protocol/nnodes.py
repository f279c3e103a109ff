"""torchrun's ``--nnodes N|MIN:MAX``: parsed, defaulted and checked in one place.

Several parts of the product need the same two numbers. The launcher writes them into
every agent's command line. The spare count is the nodes beyond MAX. The restart policy's
minimum is MIN. The hang watch asks whether a joining node restarts the workers, which
happens only while fewer than MAX nodes are in. If each part parsed the option and
applied the defaults itself, they would drift apart. They did: an elastic job given no
``--nnodes`` on more than 64 nodes got ``1:<node count>`` from the launcher, while the
hang watch assumed 64. So every one of them reads :class:`NodeRange`. The launcher
publishes the range it computed in the attempt's spec (``JobSpec.nnodes``), and the
controller reads that value back rather than working it out again.

Plain Python: ``dlc`` on a laptop and the nodes use the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootstrap_scripts.protocol.errors import ProtocolError

#: torchrun's MAX for an elastic job given no ``--nnodes`` (never below the node count:
#: :func:`node_range`). It caps how many nodes may join the job.
ELASTIC_MAX_NODES = 64
#: The launcher ``dl-run`` uses unless ``--launcher`` says otherwise. It is the only one
#: with an elastic rendezvous.
TORCHRUN = "torchrun"


class NodeRangeError(ProtocolError):
    """A ``--nnodes`` value (or an option combined with it) that cannot work. The message
    names the value."""


@dataclass(frozen=True)
class NodeRange:
    """The fewest (``min``) and most (``max``) nodes torchrun's rendezvous admits."""

    min: int
    max: int

    def __post_init__(self) -> None:
        if type(self.min) is not int or type(self.max) is not int or \
                not 1 <= self.min <= self.max:
            raise NodeRangeError(f"--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got "
                                 f"{self.min!r}:{self.max!r}")

    def __str__(self) -> str:
        """torchrun's own form: ``N`` for a fixed size, ``MIN:MAX`` for a range."""
        return str(self.min) if self.min == self.max else f"{self.min}:{self.max}"

    def spares(self, count: int) -> int:
        """How many of ``count`` nodes get no rank: those beyond MAX. torchrun keeps them
        on its redundancy list. When a participant leaves, the next round takes a spare in
        its place, so the job restarts once at full size instead of shrinking. A
        replacement that joins later becomes a spare without restarting anyone
        (docs/elastic-training.md, "Spare nodes"). A job that is not elastic can have
        them too when ``--nnodes N`` is below the node count. They stay idle, because
        such a job's restarts are whole new attempts."""
        return max(0, count - self.max)

    def has_room(self, members: int) -> bool:
        """Whether the rendezvous takes one more node while ``members`` are in. A node
        that joins a round that is already full waits as a spare."""
        return members < self.max


def parse_nnodes(value: str) -> NodeRange:
    """``N`` or ``MIN:MAX`` -> NodeRange. Raises NodeRangeError naming the value."""
    parts = value.split(":") if isinstance(value, str) else []
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) not in (1, 2):
        raise NodeRangeError(f"--nnodes must be N or MIN:MAX, got {value!r}")
    if min(nums) < 1 or nums[0] > nums[-1]:
        raise NodeRangeError(f"--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got "
                             f"{value!r}")
    return NodeRange(nums[0], nums[-1])


def node_range(value: str, count: int, *, elastic: bool) -> NodeRange:
    """The range a job on ``count`` nodes runs with. ``value`` is ``--nnodes`` as given
    ("" when it was not). The default differs by kind of job. A fixed job uses exactly
    its nodes. An elastic job uses ``1:MAX``, where MAX is :data:`ELASTIC_MAX_NODES`, or
    the node count when that is larger. With a MIN of 1, any node but the master may
    leave. With MAX not below the node count, none of the job's own nodes is a spare. An
    elastic job given ``--nnodes`` must give a range."""
    if not value:
        return NodeRange(1, max(ELASTIC_MAX_NODES, count)) if elastic else \
            NodeRange(count, count)
    given = parse_nnodes(value)
    if elastic and ":" not in value:
        raise NodeRangeError(f"an elastic job needs --nnodes MIN:MAX, got {value!r}")
    return given


def requested_minimum(value: str) -> int:
    """MIN of the ``--nnodes`` value a job asked for, known before any attempt runs. The
    restart policy uses it to choose how few nodes to start on. MIN does not depend on
    the node count, because the elastic default is 1. A malformed value counts as 1
    here, and the runner refuses it with its own message when the attempt starts."""
    try:
        return parse_nnodes(value).min if value else 1
    except NodeRangeError:
        return 1


def check_torchrun_options(launcher: str | None, elastic: bool, nnodes: str | None) -> None:
    """The rules that ``dl-run`` applies to ``--elastic`` and ``--nnodes`` before anything
    runs, so ``dlc submit`` can refuse the same values on the laptop. ``launcher`` None
    means dl-run's default (torchrun), and ``nnodes`` None or "" means it was not given.
    Only torchrun has an elastic rendezvous. Raises NodeRangeError naming the value."""
    if elastic and (launcher or TORCHRUN) != TORCHRUN:
        raise NodeRangeError(f"--elastic needs the torchrun launcher (its elastic "
                             f"rendezvous), not {launcher!r}")
    node_range(nnodes or "", 1, elastic=elastic)
