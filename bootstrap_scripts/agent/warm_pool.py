"""Warm pool launches: prepare, hold, and join only once the instance goes into service.

With a warm pool (``warmPoolSize``, constructs_lib/warm_pool.py) a worker is launched twice
in its life: first into the pool, where it runs its user data (install, EFS mount) and is
then stopped, and later out of it, when Auto Scaling starts it to replace a lost worker. The
agent must not register on the first: a worker that is about to be stopped would join the
cluster and vanish from it a moment later.

The agent tells the two apart as AWS documents: the instance metadata item
``autoscaling/target-lifecycle-state`` is the state Auto Scaling is moving the instance to,
``Warmed:Stopped`` (or ``Warmed:Running`` / ``Warmed:Hibernated``) on the way into the pool,
``InService`` on the way into the group
(https://docs.aws.amazon.com/autoscaling/ec2/userguide/retrieving-target-lifecycle-state-through-imds.html).

The group's launch lifecycle hook (``--launch-hook``) holds the instance in
``Warmed:Pending:Wait`` until the agent, its bootstrap done, says it is ready and the master
completes the action (``bootstrap_scripts.agent.warm_ready``: a worker cannot complete one
itself); Auto Scaling then stops the instance, and this agent with it. When the instance is
started again, systemd starts a new agent (user data runs only on the first boot), which
reads ``InService``, says it is ready again (the hook now holds it in ``Pending:Wait``) and
joins (https://docs.aws.amazon.com/autoscaling/ec2/userguide/warm-pool-instance-lifecycle.html).
A cold launch (the pool empty) reads ``InService`` at once and takes that path too.

:func:`decide` is the pure table; :func:`await_service` the loop around the two AWS calls.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable

#: The metadata item Auto Scaling updates before each steady state (IMDS).
TARGET_LIFECYCLE_STATE_PATH = "latest/meta-data/autoscaling/target-lifecycle-state"
#: Attempts to say "ready" before the hook's heartbeat timeout is left to decide.
COMPLETE_ATTEMPTS = 5
#: First retry delay of the ready message and of an unreadable target state (seconds).
RETRY_SECONDS = 1.0


class Step(enum.Enum):
    """What the agent does for a target lifecycle state."""

    #: go on: register and play the role (InService, or no Auto Scaling state at all)
    JOIN = "join"
    #: prepared for the warm pool: complete the launch hook once, then wait
    HOLD = "hold"
    #: the instance is being terminated from the pool: never join
    LEAVE = "leave"


#: Steady states of a warm pool instance that is (or is about to be) stopped, running or
#: hibernated in the pool.
WARMED_STATES = ("Warmed:Stopped", "Warmed:Running", "Warmed:Hibernated")
#: Target states of an instance on its way out.
LEAVING_STATES = ("Warmed:Terminated", "Terminated")


def decide(target_state: str | None) -> Step:
    """The step for ``target_state`` (None: the metadata service has no such item, as on an
    instance outside any group). Unknown or other steady states (Standby, Detached) keep the
    behaviour of a node without a warm pool: join."""
    if target_state in WARMED_STATES:
        return Step.HOLD
    if target_state in LEAVING_STATES:
        return Step.LEAVE
    return Step.JOIN


def complete_with_retries(complete: Callable[[], str], log: logging.Logger,
                          stop: threading.Event, *, attempts: int = COMPLETE_ATTEMPTS,
                          delay: float = RETRY_SECONDS) -> str:
    """``complete()`` retried with doubling delays; ``failed`` after ``attempts`` (the hook's
    heartbeat timeout and default result then decide, as for a lost agent)."""
    for attempt in range(1, attempts + 1):
        try:
            return complete()
        except Exception as exc:  # throttling, a network blip, a missing permission
            log.warning("event=launch-hook-failed attempt=%d error=%r", attempt, exc)
        if stop.wait(delay * 2 ** (attempt - 1)):
            break
    return "failed"


def await_service(read_state: Callable[[], str | None], complete: Callable[[], str], *,
                  stop: threading.Event, log: logging.Logger, poll: float,
                  sleep: Callable[[float], bool] | None = None) -> bool:
    """Hold while the target lifecycle state is ``Warmed:*``; True once the node may join
    (the launch hook completed for the ``InService`` transition), False if it must not
    (being terminated, or ``stop`` set while held).

    ``read_state``: the metadata item (None if not served; an exception is retried).
    ``complete``: :meth:`warm_ready.ReadySignal.send` (the master then completes the
    action). While held, the instance says so once, so Auto Scaling stops it, prepared."""
    wait = sleep or stop.wait
    prepared = False
    held_since: float | None = None
    while True:
        try:
            target = read_state()
        except Exception as exc:  # the metadata service can briefly refuse early in boot
            log.warning("event=target-lifecycle-state-unreadable error=%r", exc)
            if wait(RETRY_SECONDS):
                return False
            continue
        step = decide(target)
        if step is Step.LEAVE:
            log.info("event=warm-pool-leave target=%s (not joining)", target)
            return False
        if step is Step.JOIN:
            result = complete_with_retries(complete, log, stop)
            log.info("event=launch-hook target=%s result=%s held_s=%.1f", target, result,
                     0.0 if held_since is None else time.monotonic() - held_since)
            return True
        if not prepared:
            held_since = time.monotonic()
            result = complete_with_retries(complete, log, stop)
            log.info("event=warm-pool-prepared target=%s launch_hook=%s (not joining: "
                     "Auto Scaling stops this instance; it joins when started InService)",
                     target, result)
            prepared = True
        if wait(poll):
            return False
