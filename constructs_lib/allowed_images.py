"""The stack's ``allowedImages``: the repositories a cluster may run job images from, and
the node roles' pull rights on those that are ECR repositories.

WHY here: the list is the administrator's statement of whose code and bytes the cluster
trusts. The nodes get it through their user data (``dl-run --image`` refuses any other
repository: ``bootstrap_scripts/containers/allow.py``), and the node roles may pull from
exactly the ECR repositories it names, nothing else of ECR: ``ecr:GetAuthorizationToken``
(which names no resource) and the three pull actions on those repositories' ARNs (a prefix
entry: the repository of that name and every repository under it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from aws_cdk import Aws
from aws_cdk import aws_iam as iam

from bootstrap_scripts.containers.allow import check_entries, parse_entries
from constructs_lib.validation import ConfigError

#: What pulling an image needs from ECR once the registry's token is there.
PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                "ecr:BatchCheckLayerAvailability")
_ECR = re.compile(r"(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com"
                  r"(?:\.cn)?(?:/(?P<path>.+))?")


def check_allowed_images(name: str, value: object) -> tuple[str, ...]:
    """The setting: comma-separated (context) or a list of registries / repository
    prefixes; ConfigError naming the setting and the bad entry."""
    text = value if isinstance(value, str) else ",".join(map(str, value or ()))  # type: ignore[arg-type]
    try:
        return check_entries(parse_entries(text))
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def ecr_repository_arns(entries: Iterable[str], partition: str = Aws.PARTITION) -> list[str]:
    """The ARNs (patterns) of the ECR repositories ``entries`` name, in order."""
    arns: list[str] = []
    for entry in entries:
        match = _ECR.fullmatch(entry)
        if not match:
            continue
        base = f"arn:{partition}:ecr:{match['region']}:{match['account']}:repository/"
        path = match["path"]
        arns += [f"{base}{path}", f"{base}{path}/*"] if path else [f"{base}*"]
    return arns


def grant_image_pulls(roles: Sequence[iam.IRole], entries: Iterable[str]) -> None:
    """ECR pull rights on the listed ECR repositories for ``roles`` (none: no ECR at all)."""
    arns = ecr_repository_arns(entries)
    if not arns:
        return
    for role in roles:
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["ecr:GetAuthorizationToken"], resources=["*"]))
        role.add_to_principal_policy(iam.PolicyStatement(actions=list(PULL_ACTIONS),
                                                         resources=arns))


def prefix_patterns(entries: Iterable[str]) -> list[str]:
    """The wildcard ARNs as cdk-nag names them in its findings (one per prefix entry)."""
    return [arn for arn in ecr_repository_arns(entries, "<AWS::Partition>") if arn.endswith("*")]
