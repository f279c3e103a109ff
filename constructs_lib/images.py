"""Deep Learning AMI selection from AWS's public SSM parameters (no hard-coded AMI table).

The parameter is resolved by CloudFormation at deploy time, so synth needs no AWS access and
every deploy picks up the latest patched DLAMI.
"""

from __future__ import annotations

from dataclasses import dataclass

import jsii
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from constructs_lib import validation
from constructs_lib.validation import ConfigError


@dataclass(frozen=True)
class ImageFamily:
    """What the cluster needs to know about an OS family of the Deep Learning AMI."""

    ssm_parameter: str
    root_device_name: str
    python: str


#: PyTorch DLAMIs (OSS NVIDIA driver). `/opt/pytorch/bin/python` carries torch + torchrun.
IMAGE_FAMILIES: dict[str, ImageFamily] = {
    "ubuntu": ImageFamily(
        ssm_parameter=(
            "/aws/service/deeplearning/ami/x86_64/"
            "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id"
        ),
        root_device_name="/dev/sda1",
        python="/opt/pytorch/bin/python",
    ),
    "amazon-linux-2023": ImageFamily(
        ssm_parameter=(
            "/aws/service/deeplearning/ami/x86_64/"
            "oss-nvidia-driver-gpu-pytorch-2.9-amazon-linux-2023/latest/ami-id"
        ),
        root_device_name="/dev/xvda",
        python="/opt/pytorch/bin/python",
    ),
}

#: The image family of the constructs' default machine image.
DEFAULT_IMAGE_TYPE = "ubuntu"


def image_family(image_type: str) -> ImageFamily:
    try:
        return IMAGE_FAMILIES[image_type]
    except KeyError:
        known = ", ".join(sorted(IMAGE_FAMILIES))
        raise ConfigError(f"image_type must be one of {known}, got {image_type!r}") from None


def deep_learning_ami(
    image_type: str = DEFAULT_IMAGE_TYPE, *, ssm_parameter: str | None = None
) -> ec2.IMachineImage:
    """The latest PyTorch Deep Learning AMI of ``image_type``, resolved at deploy time from
    its public SSM parameter (or from ``ssm_parameter``). For an AMI id use :class:`FixedAmi`."""
    family = image_family(image_type)
    return ec2.MachineImage.from_ssm_parameter(
        ssm_parameter or family.ssm_parameter, os=ec2.OperatingSystemType.LINUX
    )


@jsii.implements(ec2.IMachineImage)
class FixedAmi:
    """One AMI id (``ami-...``) used as is, in whatever region the stack deploys to: the
    helper for a custom or copied AMI, e.g. ``machine_image=FixedAmi("ami-0123456789abcdef0")``.

    ``MachineImage.generic_linux`` needs a region map, which breaks env-agnostic stacks; a
    custom AMI (copied or built by the user) is simply an id. A malformed id raises
    :class:`~constructs_lib.validation.ConfigError`.
    """

    def __init__(self, ami_id: str) -> None:
        self.ami_id = validation.ami_id("ami_id", ami_id)

    def get_image(self, scope: Construct) -> ec2.MachineImageConfig:
        return ec2.MachineImageConfig(
            image_id=self.ami_id,
            os_type=ec2.OperatingSystemType.LINUX,
            user_data=ec2.UserData.for_linux(),
        )
