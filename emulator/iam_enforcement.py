"""moto's IAM authorization, switched on after the deploy, evaluating what AWS evaluates.

moto can check every request against the caller's IAM policies (``INITIAL_NO_AUTH_ACTION_COUNT``,
``moto.core.authorization``), but out of the box it cannot serve a deployed cluster:

- every request must be signed by keys moto issued, so the harness's ``testing`` keys (the
  deployer's, the emulated AWS services') would be refused with ``InvalidClientTokenId``;
- it evaluates a ``Resource`` only for S3 (bucket / key), SQS (the queue a ``QueueUrl``
  names; GetQueueUrl's ``QueueName`` is not read), STS ``AssumeRole``
  (the role) and a few IAM calls; every other call is checked against the resource ``*``, so
  a grant scoped to a KMS key, an Auto Scaling group, a log group, a stack or a Command
  document never matches (here: the key, the group, the log group / stream, the stack and
  the document a call names, the secret);
- a trust policy's ``AWS`` principal must equal the caller's ARN, so the job role (trusted by
  the node roles' ARNs) cannot be assumed by a node's role session, which AWS allows
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_principal.html#principal-roles);
  a ``Service`` principal makes its check fail with an error;
- a GET is checked against a signature of moto's parsed parameters, not of the empty body
  sent (for Lambda's REST calls the parameters are the headers), so no Lambda GetFunction*
  call ever matched;
- policy variables (``${aws:PrincipalTag/dl-user}``, ``${aws:userid}``) are matched as
  literal text, and AssumeRole's session tags are not kept
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html).

:func:`install` fills those gaps in moto's process (``emulator.cloud``); :func:`enable` turns
the checks on: the ``testing`` keys become the account administrator's session (role
:data:`ADMIN_ROLE`, policy ``*`` on ``*``: whoever deployed the stack, and the emulator
playing AWS's own services, such as EC2 assuming an instance profile's role), and every
other caller is held to its policies. What moto still does not evaluate (conditions,
resource-based policies, ...) is listed in docs/emulator.md.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from typing import Any

ADMIN_ROLE = "dl-emulator-admin"
#: The harness's static keys (``emulator.deploy.aws_env``), which become the admin session.
HARNESS_KEY = "testing"
_ADMIN_POLICY = {"Version": "2012-10-17",
                 "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
_TRUST_ACCOUNT = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": "{account}"}}]}

#: access key id -> the session tags it was issued with (``AssumeRole`` ``Tags``).
_SESSION_TAGS: dict[str, dict[str, str]] = {}
_LOCAL = threading.local()  # the policy variables of the request being checked
_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_UNMATCHABLE = "\x00"  # a variable without a value: the statement cannot match (AWS's rule)
_installed = False


def glob_match(pattern: str, value: str, variables: dict[str, str]) -> bool:
    """IAM's matching of an ``Action`` / ``Resource`` element: policy variables substituted,
    ``*`` any run of characters, ``?`` one, everything else literal."""
    parts: list[str] = []
    pos = 0
    for m in _VARIABLE.finditer(pattern):
        parts.append(_glob_to_regex(pattern[pos:m.start()]))
        name = m.group(1)
        if name in ("*", "?", "$"):  # ${*} ${?} ${$}: the character itself
            parts.append(re.escape(name))
        else:
            parts.append(re.escape(variables.get(name, _UNMATCHABLE)))
        pos = m.end()
    parts.append(_glob_to_regex(pattern[pos:]))
    return re.fullmatch("".join(parts), value, re.DOTALL) is not None


def _glob_to_regex(text: str) -> str:
    return "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in text)


def principal_matches(expected: Any, caller: str, account: str) -> bool:
    """Whether a trust policy's ``Principal`` names ``caller`` as AWS does: the exact ARN;
    for a role session (``sts::A:assumed-role/R/S``) the role's ARN; the account
    (``A`` or ``arn:aws:iam::A:root``) for any of its principals; ``*``. A ``Service``
    principal is the emulator's own admin session (the emulator plays the AWS services)."""
    if expected == "*":
        return True
    if not isinstance(expected, dict):
        return False
    names = expected.get("AWS", [])
    names = [names] if isinstance(names, str) else list(names)
    candidates = {caller}
    m = re.fullmatch(r"arn:([^:]+):sts::(\d+):assumed-role/([^/]+)/.+", caller)
    if m:
        partition, acct, role = m.groups()
        candidates.add(f"arn:{partition}:iam::{acct}:role/{role}")
        if role == ADMIN_ROLE and expected.get("Service"):
            return True
    if any(n == "*" or n in candidates for n in names):
        return True
    caller_account = caller.split(":")[4] if caller.count(":") >= 5 else ""
    return caller_account == account and any(
        n in (account, f"arn:aws:iam::{account}:root") for n in names)


def _variables(access_key: Any, account: str) -> dict[str, str]:
    """The request's policy variables (``aws:PrincipalTag/K``, ``aws:userid``,
    ``aws:username``) from moto's access key object."""
    out: dict[str, str] = {}
    key_id = getattr(access_key, "_access_key_id", "")
    if hasattr(access_key, "_owner_role_name"):  # a role session
        for k, v in _SESSION_TAGS.get(key_id, {}).items():
            out[f"aws:PrincipalTag/{k}"] = v
        try:
            role = access_key.backend.get_role(access_key._owner_role_name)
            out["aws:userid"] = f"{role.id}:{access_key._session_name}"
        except Exception:  # a deleted role: no variable, nothing matches
            pass
    elif hasattr(access_key, "_owner_user_name"):
        try:
            user = access_key.backend.get_user(access_key._owner_user_name)
        except Exception:
            return out
        out["aws:username"] = user.name
        out["aws:userid"] = user.id
        for tag in access_key.backend.list_user_tags(user.name):
            out[f"aws:PrincipalTag/{tag['Key']}"] = tag["Value"]
    return out


def _only_enforced(determine: Any) -> Any:
    """moto asks every call for its resource; with the checks off the answer is unused, so
    the emulator's lookups run only while they are on."""
    def wrapper(self: Any) -> str:
        return determine(self) if enabled() else "*"
    return wrapper


def _kms_resource(self: Any) -> str:
    key_id = self._get_param("KeyId")
    try:
        return self.kms_backend.describe_key(key_id).arn if key_id else "*"
    except Exception:  # moto answers NotFound itself after the check
        return "*"


def _autoscaling_resource(self: Any) -> str:
    name = self._get_param("AutoScalingGroupName")
    group = self.autoscaling_backend.autoscaling_groups.get(name) if name else None
    return group.arn if group is not None else "*"


def _logs_resource(self: Any) -> str:
    group = self._get_param("logGroupName")
    if not group:
        return "*"
    base = f"arn:aws:logs:{self.region}:{self.current_account}:log-group:{group}"
    stream = self._get_param("logStreamName")
    return f"{base}:log-stream:{stream}" if stream else f"{base}:*"


def _sqs_resource(original: Any) -> Any:
    """GetQueueUrl names its queue by ``QueueName`` (moto reads only ``QueueUrl``)."""
    def determine(self: Any) -> str:
        name = self._get_param("QueueName")
        if name and not self._get_param("QueueUrl"):
            try:
                return self.sqs_backend.get_queue(name).queue_arn
            except Exception:  # no such queue: moto answers that itself after the check
                return "*"
        return original(self)
    return determine


def _cloudformation_resource(self: Any) -> str:
    name = self._get_param("StackName")
    if not name:
        return "*"
    try:
        return self.cloudformation_backend.get_stack(name).stack_id
    except Exception:  # no such stack: moto answers that itself after the check
        return "*"


def _ssm_resource(self: Any) -> str:
    """A Command document's ARN (AWS's own documents have no account in theirs). AWS also
    checks SendCommand against each target instance; moto checks one resource per call."""
    name = self._get_param("DocumentName")
    if not name or name.startswith("arn:"):
        return name or "*"
    account = "" if name.startswith(("AWS-", "AWSSupport-", "AmazonCloudWatch-")) \
        else self.current_account
    return f"arn:aws:ssm:{self.region}:{account}:document/{name}"


def _secretsmanager_resource(self: Any) -> str:
    """The secret a call names. Reading a secret's value also needs ``kms:Decrypt`` on its
    customer-managed key (Secrets Manager decrypts with the caller's permissions,
    https://docs.aws.amazon.com/secretsmanager/latest/userguide/security-encryption.html):
    the key is noted for :func:`install`'s second check."""
    from moto.kms.models import kms_backends

    from emulator.moto_secrets import secret_key_arn

    secret_id = self._get_param("SecretId")
    if not secret_id:
        return "*"
    try:
        arn = self.backend.describe_secret(secret_id).arn
    except Exception:  # no such secret: Secrets Manager answers that itself after the check
        return "*"
    if self._get_action() == "GetSecretValue":
        _LOCAL.decrypt_key = secret_key_arn(
            self.backend, kms_backends[self.current_account][self.region], secret_id)
    return arn


def install() -> None:
    """Fill moto's gaps (idempotent); the checks stay off until :func:`enable`."""
    global _installed
    if _installed:
        return
    _installed = True
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.cloudformation.responses import CloudFormationResponse
    from moto.iam import access_control as ac
    from moto.kms.responses import KmsResponse
    from moto.logs.responses import LogsResponse
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.sqs.responses import SQSResponse
    from moto.ssm.responses import SimpleSystemManagerResponse
    from moto.sts.responses import TokenResponse as STSResponse

    KmsResponse._determine_resource = _only_enforced(_kms_resource)
    AutoScalingResponse._determine_resource = _only_enforced(_autoscaling_resource)
    LogsResponse._determine_resource = _only_enforced(_logs_resource)
    CloudFormationResponse._determine_resource = _only_enforced(_cloudformation_resource)
    SimpleSystemManagerResponse._determine_resource = _only_enforced(_ssm_resource)
    SecretsManagerResponse._determine_resource = _only_enforced(_secretsmanager_resource)
    SQSResponse._determine_resource = _sqs_resource(SQSResponse._determine_resource)

    original_check = ac.IAMRequestBase.check_action_permitted

    def check_action_permitted(self: Any, resource: str) -> None:
        _LOCAL.variables = _variables(self._access_key, self.account_id)
        _LOCAL.account = self.account_id
        decrypt_key, _LOCAL.decrypt_key = getattr(_LOCAL, "decrypt_key", ""), ""
        action = original_action = self._action
        try:
            original_check(self, resource)
            if decrypt_key:  # GetSecretValue of a secret with a customer-managed key
                self._action = action = "kms:Decrypt"
                resource = decrypt_key
                original_check(self, decrypt_key)
        except Exception:
            # what CloudTrail would show: who was refused what, on which resource
            _log(f"denied {self._access_key.arn} {action} on {resource} "
                 f"(variables {sorted(_LOCAL.variables.items())})")
            raise
        finally:
            _LOCAL.variables = {}
            self._action = original_action

    def match(pattern: str, string: str) -> bool | None:
        # moto tests the result with ``is not None`` as well as for truth
        return glob_match(pattern, string, getattr(_LOCAL, "variables", {})) or None

    def check_principal(self: Any, principal: str) -> bool:
        expected = self._statement.get("Principal")
        return not expected or principal_matches(expected, principal,
                                                 getattr(_LOCAL, "account", ""))

    original_request = ac.IAMRequestBase._create_aws_request

    def create_aws_request(self: Any) -> Any:
        # A signature covers the bytes sent, and a GET sends none. moto signs its parsed
        # ``data`` for any request without a raw body (right for a form POST, whose body it
        # parsed), which for Lambda's REST GETs is the request's headers: every
        # GetFunctionConfiguration failed with SignatureDoesNotMatch.
        request = original_request(self)
        if not self._body and self._method in ("GET", "HEAD", "DELETE"):
            request.data = b""
        return request

    ac.IAMRequestBase.check_action_permitted = check_action_permitted
    ac.IAMRequestBase._create_aws_request = create_aws_request
    ac.IAMPolicyStatement._match = staticmethod(match)
    ac.IAMPolicyStatement._check_principal = check_principal

    original_assume = STSResponse.assume_role

    def assume_role(self: Any) -> Any:
        result = original_assume(self)
        tags = _request_tags(self)
        if tags:
            role = result.result["Credentials"] if hasattr(result, "result") else None
            if role is not None:
                _SESSION_TAGS[role.access_key_id] = tags
                _log(f"session {role.arn} tagged {tags}")
        return result

    STSResponse.assume_role = assume_role


def _log(line: str) -> None:
    """One line on the emulator's stderr (``logs/cloud.log`` in the demo), only while on."""
    if enabled():
        print(f"iam: {line}", file=sys.stderr, flush=True)


def _request_tags(response: Any) -> dict[str, str]:
    """AssumeRole's ``Tags.member.N.Key`` / ``.Value`` query parameters."""
    out: dict[str, str] = {}
    qs = response.querystring
    n = 1
    while f"Tags.member.{n}.Key" in qs:
        out[qs[f"Tags.member.{n}.Key"][0]] = qs.get(f"Tags.member.{n}.Value", [""])[0]
        n += 1
    return out


def enable(account: str, partition: str = "aws") -> str:
    """Turn moto's checks on in this process; the ``testing`` keys become the admin's
    session. Returns the admin role's ARN."""
    from moto import settings
    from moto.iam.models import iam_backends
    from moto.sts.models import sts_backends

    install()
    iam = iam_backends[account][partition]
    try:
        role = iam.get_role(ADMIN_ROLE)
    except Exception:  # moto's NoSuchEntity: make it
        trust = json.dumps(_TRUST_ACCOUNT).replace("{account}", account)
        role = iam.create_role(ADMIN_ROLE, trust, "/", None, "the emulator's administrator",
                               [], None)
        iam.put_role_policy(ADMIN_ROLE, "admin", json.dumps(_ADMIN_POLICY))
    sts = sts_backends[account][partition]
    if not any(r.access_key_id == HARNESS_KEY for r in sts.assumed_roles):
        session = sts.assume_role(region_name="us-east-1", role_session_name="emulator",
                                  role_arn=role.arn, policy=None, duration=43200,
                                  external_id=None)
        session.access_key_id = session.secret_access_key = HARNESS_KEY
        session.session_token = HARNESS_KEY
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # every request from now on is checked
    return role.arn


def disable() -> None:
    """The checks off again (moto's default); session tags forgotten."""
    from moto import settings

    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
    _SESSION_TAGS.clear()


def enabled() -> bool:
    from moto import settings

    return not math.isinf(settings.INITIAL_NO_AUTH_ACTION_COUNT)
