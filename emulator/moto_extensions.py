"""What the emulator adds to moto so that it answers as AWS does, in one place.

moto plays AWS for the local emulator, but it lacks some attributes and APIs the product's
templates and code use. Each gap is filled here, by extending moto's own models inside the
emulator's moto server process (``emulator.cloud``), never by changing the product to suit
the emulator. :func:`install` is idempotent and is called before the server starts.

Filled gaps (each with the AWS behaviour it reproduces):

- ``Fn::GetAtt [<AWS::EFS::FileSystem>, Arn]``: CloudFormation documents ``Arn`` as a return
  value of ``AWS::EFS::FileSystem``
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-efs-filesystem.html#aws-resource-efs-filesystem-return-values);
  moto 5.2's EFS model has no ``get_cfn_attribute``, so a template whose IAM policy grants on
  the file system's ARN (CDK's ``grant_root_access``) fails to deploy. The emulator answers
  with the ARN moto already computes for the file system (``FileSystemArn`` in
  DescribeFileSystems).
"""

from __future__ import annotations

from typing import Any

_INSTALLED = False


def _efs_get_cfn_attribute(self: Any, attribute_name: str) -> Any:
    if attribute_name == "Arn":
        return self.file_system_arn
    if attribute_name == "FileSystemId":
        return self.file_system_id
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

    raise UnformattedGetAttTemplateException()


def install() -> None:
    """Patch moto's models in this process (the one that runs moto's server)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.efs.models import FileSystem

    FileSystem.get_cfn_attribute = _efs_get_cfn_attribute  # type: ignore[method-assign]
    FileSystem.has_cfn_attr = classmethod(  # type: ignore[method-assign,assignment]
        lambda cls, attr: attr in ("Arn", "FileSystemId"))
    _INSTALLED = True
