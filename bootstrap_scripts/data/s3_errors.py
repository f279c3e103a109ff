"""The stager's words for what S3 or the disk did to one object: the job's error line.

Why a module of its own: the stager fails before the job starts, and its first error line
is all a user sees of it (``dl-run`` repeats it), so it must name the object (``s3://``
bucket and key), the cause and what to do, whichever part met it: botocore's errors of the
listing and the fetch (``client_error``), the disk, or the checksum rule
(``checksums.Unverifiable``).
"""

from __future__ import annotations

from bootstrap_scripts.data.checksums import Unverifiable
from bootstrap_scripts.data.plan import S3Object


def client_error(exc: Exception) -> tuple[str, str]:
    """(code, message) of a botocore error, or the exception's own text."""
    response = getattr(exc, "response", None) or {}
    err = response.get("Error", {})
    code = str(err.get("Code") or type(exc).__name__)
    return code, str(err.get("Message") or exc)


def object_error(bucket: str, obj: S3Object, exc: Exception) -> str:
    """What went wrong with one object, for the job's error line."""
    if isinstance(exc, Unverifiable):
        return f"s3://{bucket}/{obj.key}: {exc}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"s3://{bucket}/{obj.key}: cannot write {obj.rel}: {exc.strerror}"
    code, message = client_error(exc)
    if code in ("AccessDenied", "403", "Forbidden"):
        return f"s3://{bucket}/{obj.key}: access denied reading the object ({code})"
    if code in ("NoSuchKey", "404"):
        return f"s3://{bucket}/{obj.key}: the object disappeared while staging ({code})"
    if code in ("PreconditionFailed", "412"):
        return (f"s3://{bucket}/{obj.key}: the object changed while staging (its ETag is no "
                f"longer the listed {obj.etag}, {code}): stage again")
    return f"s3://{bucket}/{obj.key}: {code}: {message}"
