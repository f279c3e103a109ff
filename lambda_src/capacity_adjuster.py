"""Capacity adjuster: Auto Scaling notifications (via SNS) → master-queue messages.

Why it exists: when some worker instances cannot launch (account limits, insufficient
capacity), the cluster should come up with the nodes it has instead of the stack rolling
back. On each launch / launch-error the group's healthy instances are counted; a group at
its desired capacity is reported set up, a launch error that leaves it short (but at or
above its minimum) lowers desired capacity to what launched, and a group below its minimum
is reported as a failure at once so the master agent fails fast. Terminations are reported
as membership changes. A lifecycle-hook notification of a terminating instance (the worker
group's ``drain`` hook) becomes a ``drain-request``: the master agent drains the node and
completes the lifecycle action (protocol.md §7); this function never completes it itself.

Handler: ``capacity_adjuster.handler`` (the Lambda asset is the ``lambda_src/`` directory).
Configuration (environment, set by the construct; docs/protocol.md §2): ``MASTER_QUEUE_URL``,
``CLUSTER_ID``, ``CLUSTER_TAG_KEY``, ``ROLE_TAG_KEY``, optional ``LOG_LEVEL``, and for a
single-zone cluster ``ZONE_CHOICES`` and ``MAX_ZONE_MOVES``: a launch that fails for
capacity first moves both groups to the next zone (``zone_fallback``), a bounded number of
times, before desired capacity is lowered. ``LAUNCH_RETRY_SECONDS``: a transient launch
error (``launch_errors``: no capacity, throttling) is left to the group's own retries that
long after the group's creation before any of that happens; configuration and quota errors
are acted on at once. ``WAIT_HANDLE_URL``: a master group that cannot launch fails the
stack's wait condition from here (``setup_signal``), since no master agent exists to do it.

Nothing is suspended on the groups (the original suspended ReplaceUnhealthy for good, so a
group could never heal again).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

try:  # imported as lambda_src.capacity_adjuster (tests, installed package)
    from . import asg_notifications as notes
    from . import (
        capacity_block,
        cluster_release,
        custom_resources,
        launch_errors,
        setup_signal,
        zone_actions,
    )
    from . import master_messages as messages
    from . import zone_fallback as zf
    from .aws_calls import AwsCallFailed, AwsClients, RetryableFailure
    from .group_state import NotOurGroup, decide_launch, snapshot_from_description
    from .json_log import JsonLogger, get_logger
except ImportError:  # imported as capacity_adjuster (Lambda: the asset root is on sys.path)
    import asg_notifications as notes  # type: ignore[no-redef]
    import capacity_block  # type: ignore[no-redef]
    import cluster_release  # type: ignore[no-redef]
    import custom_resources  # type: ignore[no-redef]
    import launch_errors  # type: ignore[no-redef]
    import master_messages as messages  # type: ignore[no-redef]
    import setup_signal  # type: ignore[no-redef]
    import zone_actions  # type: ignore[no-redef]
    import zone_fallback as zf  # type: ignore[no-redef]
    from aws_calls import AwsCallFailed, AwsClients, RetryableFailure  # type: ignore[no-redef]
    from group_state import (  # type: ignore[no-redef]
        NotOurGroup,
        decide_launch,
        snapshot_from_description,
    )
    from json_log import JsonLogger, get_logger  # type: ignore[no-redef]

__all__ = ["Config", "ConfigError", "RetryableFailure", "handler", "process_event"]

REQUIRED_ENV = ("MASTER_QUEUE_URL", "CLUSTER_ID", "CLUSTER_TAG_KEY", "ROLE_TAG_KEY")


class ConfigError(ValueError):
    """The function's environment is incomplete; the message names what is missing."""


@dataclass(frozen=True)
class Config:
    master_queue_url: str
    cluster_id: str
    cluster_tag_key: str
    role_tag_key: str
    zones: zone_actions.ZoneSettings = field(default_factory=zone_actions.ZoneSettings)
    #: ``LAUNCH_RETRY_SECONDS``: how long a transient launch error is left to the group's
    #: own retries, counted from the group's creation (0: act on the first error).
    launch_retry_seconds: float = 0.0
    #: ``WAIT_HANDLE_URL``: the stack's wait-condition handle, signalled FAILURE when the
    #: master group cannot launch before the cluster formed ("": nothing to signal).
    wait_handle_url: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        missing = [name for name in REQUIRED_ENV if not (env.get(name) or "").strip()]
        if missing:
            raise ConfigError(
                f"missing or empty environment variable(s): {', '.join(missing)} "
                "(the CapacityAdjuster construct sets them; see docs/protocol.md §2)"
            )
        moves = (env.get("MAX_ZONE_MOVES") or "0").strip()
        retry = (env.get("LAUNCH_RETRY_SECONDS") or "0").strip()
        return cls(
            master_queue_url=env["MASTER_QUEUE_URL"].strip(),
            cluster_id=env["CLUSTER_ID"].strip(),
            cluster_tag_key=env["CLUSTER_TAG_KEY"].strip(),
            role_tag_key=env["ROLE_TAG_KEY"].strip(),
            zones=zone_actions.ZoneSettings(
                choices=zf.parse_choices(env.get("ZONE_CHOICES", "")),
                max_moves=int(moves) if moves.isdigit() else 0,
                cluster_id=env["CLUSTER_ID"].strip(),
                cluster_tag_key=env["CLUSTER_TAG_KEY"].strip(),
                role_tag_key=env["ROLE_TAG_KEY"].strip()),
            launch_retry_seconds=float(retry) if retry.isdigit() else 0.0,
            wait_handle_url=(env.get("WAIT_HANDLE_URL") or "").strip(),
        )


def _handle_instance_event(
    note: notes.Notification, config: Config, clients: AwsClients, log: JsonLogger
) -> str:
    """Act on one launch / launch-error / terminate / terminate-error; return the outcome."""
    group = clients.describe_group(note.group_name)
    if group is None:
        log.warning("record-skipped", reason="group-not-found")
        return "group-not-found"
    try:
        snapshot = snapshot_from_description(
            group,
            cluster_id=config.cluster_id,
            cluster_tag_key=config.cluster_tag_key,
            role_tag_key=config.role_tag_key,
        )
    except NotOurGroup as exc:
        log.info("record-skipped", reason="not-this-cluster", detail=str(exc))
        return "ignored-group"
    except ValueError as exc:
        log.warning("record-skipped", reason="group-malformed", detail=str(exc))
        return "group-malformed"
    state = {
        "role": snapshot.role,
        "min": snapshot.min_size,
        "desired": snapshot.desired,
        "max": snapshot.max_size,
        "launched": snapshot.launched,
    }

    if note.event == notes.INSTANCE_TERMINATING:
        message = messages.drain_request(
            asg=snapshot.name,
            role=snapshot.role,
            cluster_id=config.cluster_id,
            instance_id=note.instance_id,
            lifecycle_hook=note.lifecycle_hook,
            lifecycle_action_token=note.lifecycle_action_token,
        )
        message_id = clients.send(config.master_queue_url, message)
        log.info(
            "decision",
            action="drain-request",
            lifecycle_hook=note.lifecycle_hook,
            dedupe_key=message["dedupe_key"],
            sqs_message_id=message_id,
            **state,
        )
        return "drain-request"

    if note.event in (notes.TERMINATE, notes.TERMINATE_ERROR):
        message = messages.membership_change(
            change=notes.CHANGE_BY_EVENT[note.event],
            asg=snapshot.name,
            role=snapshot.role,
            cluster_id=config.cluster_id,
            instance_id=note.instance_id,
            desired=snapshot.desired,
            instances=list(snapshot.instances),
        )
        message_id = clients.send(config.master_queue_url, message)
        log.info(
            "decision",
            action="membership-change",
            change=message["change"],
            dedupe_key=message["dedupe_key"],
            sqs_message_id=message_id,
            **state,
        )
        return "membership-change"

    launch_error = note.event == notes.LAUNCH_ERROR
    error = launch_errors.classify(note.status_message)
    error_text = note.status_message
    if launch_error and snapshot.launched < snapshot.desired:
        left = launch_errors.retry_seconds_left(
            error, failing_since=setup_signal.created_at(group), now=time.time(),
            window=config.launch_retry_seconds)
        if left > 0:  # Auto Scaling retries the launch; its next attempt will report
            log.info("decision", action="retry", reason=f"{error.kind} launch error: left to "
                     f"the group's own retries for {left:.0f} s more", error_kind=error.kind,
                     error_code=error.code, cause=note.status_message, **state)
            return "retry"
        described = error.describe(config.launch_retry_seconds, zf.instance_types(group))
        error_text = f"{note.status_message} ({described})"
        log.info("launch-error", error_kind=error.kind, error_code=error.code,
                 cause=note.status_message, **state)
    zone = zone_actions.consider(
        launch_error=launch_error, status_message=note.status_message if launch_error else "",
        failed_zone=note.zone if launch_error else "", group=group, settings=config.zones,
        clients=clients, log=log)
    if zone.action in (zf.MOVE, zf.STALE):  # the new zone's launches will report
        return f"zone-{zone.action}"
    decision = decide_launch(snapshot, launch_error=launch_error, error_text=error_text)
    if decision.action == "wait":
        log.info("decision", action="wait", reason=decision.reason, **state)
        return "wait"

    after = snapshot
    if decision.action == "lower":
        new_desired = decision.new_desired
        # Guard the one write we make: only ever lower, never below the minimum.
        if new_desired is None or not (snapshot.min_size <= new_desired < snapshot.desired):
            log.error("decision-rejected", action="lower", new_desired=new_desired, **state)
            return "rejected"
        clients.set_desired_capacity(snapshot.name, new_desired)
        log.info(
            "capacity-lowered",
            previous_desired=snapshot.desired,
            new_desired=new_desired,
            **state,
        )
        # Report the counts AFTER the change, read back from the group itself.
        after = replace(snapshot, desired=new_desired)  # if it cannot be read back
        reread = clients.describe_group(snapshot.name)
        if reread is not None:
            try:
                after = snapshot_from_description(
                    reread,
                    cluster_id=config.cluster_id,
                    cluster_tag_key=config.cluster_tag_key,
                    role_tag_key=config.role_tag_key,
                )
            except (NotOurGroup, ValueError) as exc:
                log.warning("reread-unusable", detail=str(exc))

    status = decision.status
    if status == "success" and after.launched < after.min_size:
        status = "failure"
    message = messages.asg_setup(
        status=status,
        asg=after.name,
        role=after.role,
        cluster_id=config.cluster_id,
        min_size=after.min_size,
        desired=after.desired,
        max_size=after.max_size,
        instances=list(after.instances),
        reason=decision.reason,
        cause=note.cause if launch_error else "",
        decision=decision.action,
        attempts=zone.attempts,
    )
    message_id = clients.send(config.master_queue_url, message)
    if status == "failure" and after.role == "master" and config.wait_handle_url:
        # No master agent reads the queue when the master itself cannot launch.
        setup_signal.fail_setup(config.wait_handle_url, message, clients=clients,
                                cluster_id=config.cluster_id, tag_key=config.cluster_tag_key,
                                log=log)
    log.info(
        "decision",
        action=decision.action,
        status=status,
        reason=decision.reason,
        dedupe_key=message["dedupe_key"],
        sqs_message_id=message_id,
        desired_after=after.desired,
        launched_after=after.launched,
        **state,
    )
    return f"asg-setup-{status}"


def process_event(
    event: Any, *, config: Config, clients: AwsClients, log: JsonLogger
) -> dict[str, Any]:
    """Process every record; collect retryable failures and raise them only at the end."""
    try:
        records = notes.sns_records(event)
    except notes.MalformedRecord as exc:
        log.warning("event-skipped", reason="malformed", detail=str(exc))
        return {"records": 0, "outcomes": [], "retryable_failures": 0}

    outcomes: list[str] = []
    retryable: list[str] = []
    for index, record in enumerate(records):
        record_log = log.bind(record=index)
        try:
            note = notes.parse_record(record)
        except notes.MalformedRecord as exc:
            record_log.warning("record-skipped", reason="malformed", detail=str(exc))
            outcomes.append("malformed")
            continue
        except Exception as exc:  # a parser bug must not cost the other records
            record_log.error("record-failed", exc_info=True, detail=repr(exc)[:500])
            outcomes.append("error")
            continue
        record_log = record_log.bind(
            asg=note.group_name, notification=note.event, instance_id=note.instance_id
        )
        if note.is_test:
            record_log.info("record-skipped", reason="test-notification")
            outcomes.append("test-notification")
            continue
        if note.warm_pool_only:
            # Into the warm pool, or out of it to be terminated: no node joins, fails or
            # leaves (the group's desired capacity does not count the pool).
            record_log.info("record-skipped", reason="warm-pool", origin=note.origin,
                            destination=note.destination)
            outcomes.append("warm-pool")
            continue
        if note.event == notes.INSTANCE_LAUNCHING:
            # The stack installs no launch hook; someone else's must not be answered by us.
            record_log.info("record-skipped", reason="launch-hook-not-ours")
            outcomes.append("ignored-launch-hook")
            continue
        try:
            outcomes.append(_handle_instance_event(note, config, clients, record_log))
        except RetryableFailure as exc:
            record_log.error("record-retryable-failure", detail=str(exc))
            retryable.append(str(exc))
            outcomes.append("retryable-failure")
        except AwsCallFailed as exc:
            record_log.error("record-skipped", reason="aws-error", code=exc.code, detail=str(exc))
            outcomes.append("aws-error")
        except Exception as exc:  # one bad record never stops the others
            record_log.error("record-failed", exc_info=True, detail=repr(exc)[:500])
            outcomes.append("error")

    summary = {"records": len(records), "outcomes": outcomes, "retryable_failures": len(retryable)}
    log.info("invocation-summary", **summary)
    if retryable:
        # Raising makes Lambda retry the (asynchronous) invocation; decisions are recomputed
        # from group state, so records that already succeeded give the same messages again.
        raise RetryableFailure(f"{len(retryable)} record(s) failed retryably: {retryable}")
    return summary


class _Clients:
    """boto3 clients for the custom resources' answers, made on first use."""

    def __init__(self) -> None:
        import boto3

        self._session = boto3.session.Session()

    @property
    def autoscaling(self) -> Any:
        return AwsClients.from_environment().autoscaling

    @property
    def ec2(self) -> Any:
        return self._session.client("ec2")

    @property
    def service_quotas(self) -> Any:
        return self._session.client("service-quotas")

    @property
    def kms(self) -> Any:
        return self._session.client("kms")

    @property
    def efs(self) -> Any:
        return self._session.client("efs")


def _custom_resource(event: dict[str, Any], log: JsonLogger) -> dict[str, Any]:
    """CloudFormation's request for one of the stack's custom resources
    (``custom_resources``): answered on its ``ResponseURL``."""
    answer = custom_resources.handle(event, _Clients())
    log.info("custom-resource", type=str(event.get("ResourceType")),
             request=str(event.get("RequestType")), status=answer["Status"],
             reason=answer.get("Reason", ""))
    return {"records": 0, "outcomes": [], "retryable_failures": 0,
            "error": "" if answer["Status"] == "SUCCESS" else answer.get("Reason", "")}


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point (``capacity_adjuster.handler``)."""
    log, level_warning = get_logger(os.environ.get("LOG_LEVEL"))
    request_id = getattr(context, "aws_request_id", None)
    if request_id:
        log = log.bind(request_id=str(request_id))
    if level_warning:
        log.warning("config-warning", detail=level_warning)
    if custom_resources.is_request(event):  # the stack's custom resources
        return _custom_resource(event, log)
    if capacity_block.is_scheduled(event):  # a Capacity Block's end (its schedules)
        done = capacity_block.release_at_end(event, _Clients().autoscaling)
        log.info("capacity-block-end", **done)
        return done
    if cluster_release.is_idle_master_request(event):  # the master's own idle stop
        done = cluster_release.release_idle_master(event, _Clients().autoscaling, os.environ)
        log.info("idle-master-release", **done)
        return done
    try:
        config = Config.from_env(os.environ)
    except ConfigError as exc:
        # Not raised: a retry cannot fix the environment, and raising would only loop.
        log.error("config-error", detail=str(exc))
        return {"records": 0, "outcomes": [], "retryable_failures": 0, "error": str(exc)}
    log = log.bind(cluster_id=config.cluster_id)
    try:
        clients = AwsClients.from_environment()
    except Exception as exc:  # e.g. no region: as unfixable by a retry as a missing variable
        log.error("config-error", detail=f"cannot create AWS clients: {exc!r}"[:500])
        return {"records": 0, "outcomes": [], "retryable_failures": 0, "error": repr(exc)}
    return process_event(event, config=config, clients=clients, log=log)
