"""Which cluster ``dlc`` talks to, and with which AWS settings.

A cluster is a CloudFormation stack (``--stack``, default ``DLClusterStack``) in a region
(``--region``, else the profile's or the environment's), reached with a named profile
(``--profile``) or the environment's credentials. ``--emulator STATE`` (or ``DLC_EMULATOR``)
points at the ``state.json`` of a cluster ``make demo ARGS=--keep`` left running: it only
supplies the endpoint, region and credentials of that cluster's AWS (the emulator's moto
server); everything after that is the same AWS API calls as against a real account.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from dlc.errors import NotFound, UsageError

DEFAULT_STACK = "DLClusterStack"
#: The environment variable that names an emulator state file (same as ``--emulator``).
EMULATOR_ENV = "DLC_EMULATOR"
#: What a new terminal without ``DLC_EMULATOR`` lacks when it meant the emulated cluster:
#: said wherever dlc finds no region or no credentials.
EMULATOR_HINT = (f"for the emulated cluster of make demo ARGS=--keep: export {EMULATOR_ENV}="
                 f"/tmp/dl-demo-…/state.json (the line the demo printed)")


@dataclass(frozen=True)
class Target:
    """Where the cluster is: stack, region and how to reach its AWS."""

    stack: str = DEFAULT_STACK
    region: str = ""
    profile: str | None = None
    #: An AWS endpoint other than AWS's own (the emulator's moto server); "" = AWS.
    endpoint: str = ""
    #: Explicit credentials (from an emulator state file); empty = the usual chain.
    credentials: dict[str, str] = field(default_factory=dict)
    #: Where the settings came from, for messages.
    source: str = ""

    def session(self):
        """A boto3 session with this target's profile, region and credentials."""
        import boto3

        kwargs: dict = {"region_name": self.region or None}
        if self.profile:
            kwargs["profile_name"] = self.profile
        if self.credentials:
            kwargs.update({"aws_access_key_id": self.credentials.get("access_key_id"),
                           "aws_secret_access_key": self.credentials.get("secret_access_key"),
                           "aws_session_token": self.credentials.get("session_token") or None})
        try:
            return boto3.session.Session(**kwargs)
        except Exception as exc:  # botocore's ProfileNotFound and friends
            raise UsageError(f"cannot use AWS profile {self.profile!r}: {exc}") from None

    def client(self, service: str, region: str | None = None, config=None):
        kwargs: dict = {}
        if self.endpoint:
            kwargs["endpoint_url"] = self.endpoint
        if region:
            kwargs["region_name"] = region
        if config is not None:
            kwargs["config"] = config
        return self.session().client(service, **kwargs)

    def cli_env(self) -> dict[str, str]:
        """The environment for AWS's own CLIs (``aws``, ``npx cdk``) aimed at this target."""
        env = dict(os.environ)
        if self.region:
            env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = self.region
        if self.profile:
            env["AWS_PROFILE"] = self.profile
        if self.endpoint:
            env["AWS_ENDPOINT_URL"] = self.endpoint
        if self.credentials:
            env.pop("AWS_PROFILE", None)
            env["AWS_ACCESS_KEY_ID"] = self.credentials.get("access_key_id", "")
            env["AWS_SECRET_ACCESS_KEY"] = self.credentials.get("secret_access_key", "")
            if self.credentials.get("session_token"):
                env["AWS_SESSION_TOKEN"] = self.credentials["session_token"]
        return env

    def describe(self) -> str:
        where = f"stack {self.stack} in {self.region or '(default region)'}"
        return f"{where} ({self.source})" if self.source else where


def read_emulator_state(path: str) -> dict:
    """The AWS settings of a kept emulator cluster, from its ``state.json``."""
    p = Path(path).expanduser()
    try:
        state = json.loads(p.read_text())
    except FileNotFoundError:
        raise NotFound(f"emulator state file {p} does not exist (make demo ARGS=--keep "
                       "prints the path of the one it writes)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read emulator state file {p}: {exc}") from None
    aws = state.get("aws") or {}
    endpoint = aws.get("endpoint") or state.get("endpoint")
    if not endpoint:
        raise UsageError(f"emulator state file {p} has no endpoint: is it the state.json of "
                         "a cluster make demo ARGS=--keep left running?")
    missing = [k for k in ("region", "access_key_id", "secret_access_key") if not aws.get(k)]
    if missing:
        raise UsageError(f"emulator state file {p} lacks aws.{', aws.'.join(missing)}: it was "
                         "written by an older demo; start the cluster again with "
                         "make demo ARGS=--keep")
    return {"endpoint": str(endpoint), "region": str(aws["region"]),
            "credentials": {k: str(aws[k]) for k in
                            ("access_key_id", "secret_access_key", "session_token")
                            if aws.get(k)}}


def resolve(*, stack: str | None = None, region: str | None = None,
            profile: str | None = None, emulator: str | None = None,
            environ: dict[str, str] | None = None) -> Target:
    """The target the options and the environment name (options win)."""
    environ = os.environ if environ is None else environ
    emulator = emulator or environ.get(EMULATOR_ENV) or None
    stack = stack or DEFAULT_STACK
    if emulator:
        if profile:
            raise UsageError("--profile and --emulator exclude each other: the emulator's "
                             "state file supplies the credentials")
        st = read_emulator_state(emulator)
        return Target(stack=stack, region=region or st["region"], endpoint=st["endpoint"],
                      credentials=st["credentials"], source=f"emulator {emulator}")
    region = region or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or ""
    if not region:
        region = _profile_region(profile)
    if not region:
        raise UsageError("no AWS region: pass --region, set AWS_REGION, or give the profile "
                         f"a region (aws configure set region REGION); {EMULATOR_HINT}")
    return Target(stack=stack, region=region, profile=profile,
                  endpoint=environ.get("AWS_ENDPOINT_URL", ""),
                  source=f"profile {profile}" if profile else "")


def _profile_region(profile: str | None) -> str:
    try:
        import boto3

        return boto3.session.Session(profile_name=profile).region_name or ""
    except Exception:  # an unknown profile is reported when it is used
        return ""
