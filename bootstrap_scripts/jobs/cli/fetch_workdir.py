"""``dl-fetch-workdir BUCKET/KEY``: a directory ``dlc submit --workdir`` staged, to stdout.

Run by the cluster's Command document as root (the SSM Agent, so with the instance role's
credentials: only the master's role may get objects under ``workdirs/`` of the staging
bucket, constructs_lib/workdir_staging.py). The document checks that the key is under
``workdirs/<the job's user>/`` and hands the archive to that user's ``dl-run`` on its
standard input: this command never writes a file and never unpacks anything (the user does,
as the user, into the job's own directory on EFS).
"""

from __future__ import annotations

import re
import sys

#: ``<bucket>/workdirs/<user>/<32 hex>.tar.gz`` (the document's pattern, the same words).
LOCATION_RE = re.compile(r"^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(workdirs/[a-z_][a-z0-9_-]{0,31}"
                         r"/[0-9a-f]{32}\.tar\.gz)$")
#: The largest archive fetched (a directory that size belongs on EFS, staged otherwise).
MAX_BYTES = 2 * 1024 ** 3
CHUNK = 1024 * 1024


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    m = LOCATION_RE.match(args[0]) if len(args) == 1 else None
    if m is None:
        print("usage: dl-fetch-workdir BUCKET/workdirs/USER/ID.tar.gz", file=sys.stderr)
        return 2
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        obj = boto3.client("s3").get_object(Bucket=m.group(1), Key=m.group(2))
        size = int(obj.get("ContentLength", 0))
        if size > MAX_BYTES:
            print(f"dl-fetch-workdir: s3://{args[0]} is {size} bytes, more than "
                  f"{MAX_BYTES}", file=sys.stderr)
            return 1
        body, out = obj["Body"], sys.stdout.buffer
        while chunk := body.read(CHUNK):
            out.write(chunk)
        out.flush()
    except (BotoCoreError, ClientError) as exc:
        print(f"dl-fetch-workdir: cannot get s3://{args[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
