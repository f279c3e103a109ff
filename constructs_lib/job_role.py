"""The job role: what a training job may do in AWS, apart from what its node may do.

Jobs run as cluster users, and instance metadata (the node's role) is closed to them. A job
that needs AWS gets temporary credentials of this role instead, assumed for it by its
node's job executor with the session tag ``dl-user=<the job's user>``
(``bootstrap_scripts/jobs/executor/job_credentials.py``). Grants made here can scope a
prefix to that user with ``${aws:PrincipalTag/dl-user}`` (attribute-based access control:
https://docs.aws.amazon.com/IAM/latest/UserGuide/introduction_attribute-based-access-control.html),
so one user's job cannot touch another user's checkpoints.

Only the cluster's node roles may assume it (and must tag the session); a role assumed with
another role's credentials lasts at most one hour, which the executor's renewal covers.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

#: The session tag the executor sets and the grants below scope by.
USER_TAG = "dl-user"
#: The role's longest session (the executor asks for one hour, renewed before it ends).
MAX_SESSION = Duration.hours(1)


class JobRole(Construct):
    """A role for training jobs, assumable only by the given node roles with a user tag.

    :param node_roles: the roles of the cluster's nodes (their executors assume this role).
    :param cluster_id: the cluster's id, in the role's description.
    """

    def __init__(self, scope: Construct, construct_id: str, *,
                 node_roles: Sequence[iam.IRole], cluster_id: str) -> None:
        super().__init__(scope, construct_id)
        if not node_roles:
            raise ValueError(f"{self.node.path}: node_roles must name at least one role")
        principals = [iam.SessionTagsPrincipal(iam.ArnPrincipal(r.role_arn))
                      for r in node_roles]
        self.role = iam.Role(
            self, "Role",
            assumed_by=iam.CompositePrincipal(*principals),
            description=f"Training jobs of cluster {cluster_id}: assumed for each job by its "
                        f"nodes' job executors, tagged with the job's user",
            max_session_duration=MAX_SESSION,
        )
        #: ``arn:...`` of the role, for the nodes' user data.
        self.role_arn = self.role.role_arn
        for node_role in node_roles:
            iam.Grant.add_to_principal(grantee=node_role,
                                       actions=["sts:AssumeRole", "sts:TagSession"],
                                       resource_arns=[self.role.role_arn])

    def grant_read(self, bucket: s3.IBucket, prefix: str = "") -> iam.Grant:
        """Jobs may list and read ``prefix`` (the whole bucket when empty) of ``bucket``."""
        return bucket.grant_read(self.role, f"{prefix.rstrip('/')}/*" if prefix else "*")

    def grant_user_prefix_read_write(self, bucket: s3.IBucket, prefix: str) -> iam.Grant:
        """Jobs may read and write ``<prefix>/<their user>/`` of ``bucket``, nothing else of
        it: the user is the session's ``dl-user`` tag, which only the executor sets."""
        return bucket.grant_read_write(
            self.role, f"{prefix.strip('/')}/${{aws:PrincipalTag/{USER_TAG}}}/*")
