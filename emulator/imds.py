"""A small fake EC2 instance-metadata service (IMDSv2 only), one per emulated node.

Each emulated node gets its own endpoint bound to its own loopback address (e.g.
``127.20.128.5:PORT``); the agent finds it through ``AWS_EC2_METADATA_SERVICE_ENDPOINT``,
exactly as botocore would find the real one. Like an instance launched with
``HttpTokens=required``, it answers GETs only with a token obtained by
``PUT /latest/api/token``, so an agent that fell back to IMDSv1 would fail here too.

API::

    server = MetadataServer()
    url = server.start("127.20.128.5", 0, {"instance_id": "i-0abc", "address": "127.20.128.5",
                                            "instance_type": "p3.2xlarge", "region": "us-east-1"})
    ...
    server.stop()

or ``python -m emulator.imds --address A --port P --instance-id I ...`` (prints the URL).

With an instance role (:class:`InstanceRole`, ``--role-arn``) it also serves the role's
temporary credentials, as EC2 does for an instance launched with an instance profile: the
node's SDKs then call AWS as that role.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL = 21600


def metadata_paths(identity: Mapping[str, str]) -> dict[str, str]:
    """meta-data paths served for ``identity`` (keys as in bootstrap_scripts.agent.identity)."""
    region = identity.get("region", "us-east-1")
    az = identity.get("availability_zone") or f"{region}a"
    address = identity["address"]
    document = {"accountId": identity.get("account_id", "123456789012"),
                "architecture": "x86_64", "availabilityZone": az,
                "imageId": identity.get("ami_id", "ami-00000000000000000"),
                "instanceId": identity["instance_id"],
                "instanceType": identity.get("instance_type", "t3.micro"),
                "privateIp": address, "region": region, "version": "2017-09-30"}
    return {
        # the region lives here and in the identity document; nowhere else on a node
        "latest/dynamic/instance-identity/document": json.dumps(document, indent=2),
        "latest/meta-data/instance-id": identity["instance_id"],
        "latest/meta-data/instance-type": identity.get("instance_type", "t3.micro"),
        "latest/meta-data/local-ipv4": address,
        "latest/meta-data/local-hostname": f"ip-{address.replace('.', '-')}.ec2.internal",
        "latest/meta-data/placement/region": region,
        "latest/meta-data/placement/availability-zone": az,
        "latest/meta-data/ami-id": identity.get("ami_id", "ami-00000000000000000"),
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: tests run many of these
        pass

    def _reply(self, code: int, body: str = "", content_type: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.rstrip("/") != "/latest/api/token":
            self._reply(404, "not found")
            return
        try:
            ttl = int(self.headers.get(TOKEN_TTL_HEADER, ""))
        except ValueError:
            self._reply(400, f"missing or bad {TOKEN_TTL_HEADER}")
            return
        if not 1 <= ttl <= MAX_TTL:
            self._reply(400, f"{TOKEN_TTL_HEADER} must be 1..{MAX_TTL}")
            return
        self._reply(200, self.server.new_token(ttl))

    def do_GET(self) -> None:
        if not self.server.valid_token(self.headers.get(TOKEN_HEADER, "")):
            self._reply(401, "IMDSv2 token required")
            return
        path = self.path.split("?", 1)[0].strip("/")
        role = self.server.role
        if role is not None and path.startswith(IAM_PREFIX):
            self._reply_iam(path[len(IAM_PREFIX):].strip("/"), role)
            return
        paths = self.server.paths
        if path in paths:
            self._reply(200, paths[path])
            return
        prefix = path + "/"
        children = sorted({p[len(prefix):].split("/", 1)[0] + ("/" if "/" in p[len(prefix):]
                                                              else "")
                           for p in paths if p.startswith(prefix)})
        if children:
            self._reply(200, "\n".join(children))
        else:
            self._reply(404, "not found")


    def _reply_iam(self, rest: str, role: InstanceRole) -> None:
        """``iam/info``, ``iam/security-credentials/`` (the role's name) and the role's
        temporary credentials, as EC2 serves them for an instance profile."""
        if rest == "":
            self._reply(200, "info\nsecurity-credentials/")
        elif rest == "info":
            self._reply(200, json.dumps({"Code": "Success", "LastUpdated": _now(),
                                         "InstanceProfileArn": role.instance_profile_arn,
                                         "InstanceProfileId": role.instance_profile_id}))
        elif rest == "security-credentials":
            self._reply(200, role.name)
        elif rest == f"security-credentials/{role.name}":
            try:
                self._reply(200, json.dumps(role.credentials()))
            except Exception as exc:  # what a failed STS call looks like to the node
                self._reply(500, f"could not get the role's credentials: {exc!r}")
        else:
            self._reply(404, "not found")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


IAM_PREFIX = "latest/meta-data/iam"
#: Renew the role's credentials this long before they expire (EC2 rotates them ahead too).
REFRESH_BEFORE_SECONDS = 300


class InstanceRole:
    """The instance profile's role, whose temporary credentials the endpoint hands out: EC2
    assumes the role for the instance (``sts:AssumeRole`` against the emulated AWS, the
    session named after the instance) and serves them under
    ``iam/security-credentials/<role name>``, where every AWS SDK's default chain finds
    them (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html,
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/iam-roles-for-amazon-ec2.html)."""

    def __init__(self, role_arn: str, instance_profile_arn: str, instance_id: str,
                 region: str) -> None:
        self.arn = role_arn
        self.name = role_arn.rsplit("/", 1)[-1]
        self.instance_profile_arn = instance_profile_arn
        self.instance_profile_id = "AIPA" + secrets.token_hex(8).upper()
        self.session_name = instance_id
        self.region = region
        self._cached: dict | None = None
        self._expires = 0.0
        self._lock = threading.Lock()

    def credentials(self) -> dict:
        with self._lock:
            if self._cached is None or time.time() > self._expires - REFRESH_BEFORE_SECONDS:
                import boto3  # EC2's side: the endpoint's process has the emulated AWS's

                creds = boto3.client("sts", region_name=self.region).assume_role(
                    RoleArn=self.arn, RoleSessionName=self.session_name)["Credentials"]
                self._expires = creds["Expiration"].timestamp()
                self._cached = {
                    "Code": "Success", "LastUpdated": _now(), "Type": "AWS-HMAC",
                    "AccessKeyId": creds["AccessKeyId"],
                    "SecretAccessKey": creds["SecretAccessKey"], "Token": creds["SessionToken"],
                    "Expiration": creds["Expiration"].strftime("%Y-%m-%dT%H:%M:%SZ")}
            return dict(self._cached)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], paths: dict[str, str],
                 role: InstanceRole | None = None) -> None:
        super().__init__(address, _Handler)
        self.paths = paths
        self.role = role
        self._tokens: dict[str, float] = {}
        self._lock = threading.Lock()

    def new_token(self, ttl: int) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl
        return token

    def valid_token(self, token: str) -> bool:
        with self._lock:
            expiry = self._tokens.get(token)
        return expiry is not None and expiry > time.monotonic()


class MetadataServer:
    """One node's metadata endpoint, served from a daemon thread."""

    def __init__(self) -> None:
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self, address: str, port: int, identity, role: InstanceRole | None = None) -> str:
        """Serve ``identity`` (mapping or dataclass) on ``address:port`` (0 = any free port),
        and ``role``'s credentials when the instance has an instance profile."""
        if self._server is not None:
            raise RuntimeError(f"metadata server already running at {self.url}")
        if is_dataclass(identity):
            identity = asdict(identity)
        for key in ("instance_id", "address"):
            if not identity.get(key):
                raise ValueError(f"identity needs a non-empty {key!r}: {identity!r}")
        self._server = _Server((address, port), metadata_paths(identity), role)
        host, bound_port = self._server.server_address[:2]
        self.url = f"http://{host}:{bound_port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name=f"imds-{identity['instance_id']}")
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> MetadataServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="fake IMDSv2 endpoint for one emulated node")
    p.add_argument("--address", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--instance-id", required=True)
    p.add_argument("--instance-type", default="t3.micro")
    p.add_argument("--region", default="us-east-1")
    p.add_argument("--availability-zone", default="")
    p.add_argument("--local-ipv4", default="", help="default: --address")
    p.add_argument("--role-arn", default="", help="the instance profile's role: its "
                   "credentials are served under iam/security-credentials/ (default: none)")
    p.add_argument("--instance-profile-arn", default="")
    ns = p.parse_args(argv)
    server = MetadataServer()
    role = InstanceRole(ns.role_arn, ns.instance_profile_arn, ns.instance_id, ns.region) \
        if ns.role_arn else None
    url = server.start(ns.address, ns.port, {
        "instance_id": ns.instance_id, "instance_type": ns.instance_type,
        "address": ns.local_ipv4 or ns.address, "region": ns.region,
        "availability_zone": ns.availability_zone}, role)
    if role is not None:
        # EC2 has the role's credentials ready when the instance boots; assume the role now,
        # beside the boot, so the first SDK lookup does not wait for a new STS client here.
        threading.Thread(target=role.credentials, daemon=True, name="warm-credentials").start()
    print(json.dumps({"url": url}), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
