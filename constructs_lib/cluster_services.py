"""What a cluster gives the people who run it: operator access, workdir staging, logs and
alarms, and a daily cost budget.

:class:`~constructs_lib.cluster.DeepLearningCluster` builds its nodes; these four serve the
operators around them and depend only on the finished node groups, so they are wired here,
in one call (:func:`add_cluster_services`), as children of the cluster itself (their
construct ids, and so the template's logical ids, are the cluster's own):

- ``OperatorAccess``: the managed policies ``dlc`` needs (``operator_access.py``), and the
  per-user Command documents of ``cluster_users``;
- ``WorkdirStaging``: ``dlc submit --workdir`` stages a directory (operators under their own
  user's prefix, administrators under any) and the master fetches it;
- ``ClusterObservability``: the nodes' logs in CloudWatch, the dashboard and the alarms
  (``observability.py``); the nodes write, operators read;
- ``ClusterBudget``: with ``budget_per_day``, an AWS Budgets cost budget notifying the
  cluster's one alarm topic (``cluster_budget.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from constructs import Construct

from constructs_lib.cluster_budget import ClusterBudget
from constructs_lib.node_group import NodeGroup
from constructs_lib.observability import ClusterObservability
from constructs_lib.operator_access import OperatorAccess
from constructs_lib.workdir_staging import WorkdirStaging


@dataclass(frozen=True)
class ClusterServices:
    """The constructs :func:`add_cluster_services` made (the cluster's attributes of the same
    names)."""

    operator_access: OperatorAccess
    workdir_staging: WorkdirStaging
    observability: ClusterObservability
    #: None without ``budget_per_day``
    budget: ClusterBudget | None


def add_cluster_services(scope: Construct, *, cluster_id: str, master_group: NodeGroup,
                         worker_group: NodeGroup, cluster_users: Sequence[str],
                         log_retention_days: int, alarm_email: str | None,
                         budget_per_day: float | None, efs_file_system_id: str,
                         efs_io_alarm_gib_per_hour: int) -> ClusterServices:
    """Operator access, workdir staging, observability and the budget of the cluster
    ``scope`` (the props are the cluster's own, checked by each construct)."""
    # What an operator's role needs for dlc (status, jobs, scale, sessions): a managed
    # policy scoped to this cluster's tag (``operator_access.policy``).
    operator_access = OperatorAccess(scope, "OperatorAccess", cluster_id=cluster_id,
                                     cluster_users=cluster_users)
    # dlc submit --workdir: operators stage a directory (under their own user's prefix;
    # administrators under any), the master fetches it.
    workdir_staging = WorkdirStaging(scope, "WorkdirStaging")
    workdir_staging.grant_stage(operator_access.policy, per_user_tag=operator_access.user_tag)
    workdir_staging.grant_stage(operator_access.admin_policy)
    workdir_staging.grant_fetch(master_group.role)
    # Logs in CloudWatch, the dashboard, the alarms (constructs_lib/observability.py).
    observability = ClusterObservability(
        scope, "Observability", cluster_id=cluster_id,
        groups=[g.auto_scaling_group for g in (master_group, worker_group)],
        log_retention_days=log_retention_days, alarm_email=alarm_email,
        efs_file_system_id=efs_file_system_id,
        efs_io_alarm_gib_per_hour=efs_io_alarm_gib_per_hour)
    for group in (master_group, worker_group):
        observability.grant_write(group.role)
    observability.grant_read(operator_access.policy)
    budget: ClusterBudget | None = None
    if budget_per_day is not None:
        observability.allow_alarms_from("budgets.amazonaws.com")
        budget = ClusterBudget(scope, "Budget", cluster_id=cluster_id,
                               usd_per_day=budget_per_day, topic=observability.alarm_topic)
        budget.node.add_dependency(observability.alarm_topic)
    return ClusterServices(operator_access, workdir_staging, observability, budget)
