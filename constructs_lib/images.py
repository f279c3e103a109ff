"""Deep Learning AMI selection from AWS's public SSM parameters (no hard-coded AMI table).

The parameter is resolved by CloudFormation at deploy time, so synth needs no AWS access and
every deploy picks up the latest patched DLAMI of the chosen line. AWS documents the name as
``/aws/service/deeplearning/ami/<architecture>/<ami_type>/latest/ami-id``, where ``ami_type``
is the DLAMI's name without "Deep Learning" and "AMI" (docs/node-agent.md, "The machine
image"); for the PyTorch DLAMIs with the open-source NVIDIA driver that is
``oss-nvidia-driver-gpu-pytorch-<major.minor>-<os>``. The PyTorch version is part of the name,
so it is a setting (``pytorch_version``), validated against that naming.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jsii
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from constructs_lib import validation
from constructs_lib.validation import ConfigError

#: The documented PyTorch version form in DLAMI names: major.minor ("2.13"), no patch level.
_PYTORCH_VERSION = re.compile(r"^[1-9][0-9]*\.(0|[1-9][0-9]*)$")
#: The one architecture the cluster's instance types (g*, p*) use.
ARCHITECTURE = "x86_64"


@dataclass(frozen=True)
class ImageFamily:
    """What the cluster needs to know about an OS family of the PyTorch Deep Learning AMI.

    ``pytorch_lines`` are the PyTorch lines whose x86_64 OSS-driver DLAMI of this OS AWS's
    release notes list, each a separate SSM parameter (docs/node-agent.md, "The machine
    image"); ``default_pytorch`` is the newest of them. ``efs_utils_install`` is the boot
    command that installs amazon-efs-utils (``mount.efs``, needed for TLS to EFS) from the
    OS's own package repository, or empty where the OS has no such package.
    ``cloudwatch_agent_install`` installs the CloudWatch agent the way AWS documents for
    the OS (``{region}``: the node's region), which ships the node's logs
    (``constructs_lib/observability.py``)."""

    os_suffix: str
    root_device_name: str
    python: str
    default_pytorch: str
    efs_utils_install: str
    pytorch_lines: tuple[str, ...] = ()
    cloudwatch_agent_install: str = ""
    #: installs Mountpoint for Amazon S3 (``mount-s3``, for ``dl-run --mount``) the way AWS
    #: documents for the OS ("Installing Mountpoint", mountpoint-installation.html)
    mount_s3_install: str = ""
    #: installs ``nft`` (nftables) unless the image has it: each node's executor keeps other
    #: users away from what a job listens on with an nftables table of its own
    #: (``bootstrap_scripts/jobs/executor/listen_guard.py``)
    nftables_install: str = ""
    #: installs the Lustre client (``sharedStorage=fsx-lustre``) the way AWS documents for
    #: the OS ("Installing the Lustre client", install-lustre-client.html)
    lustre_client_install: str = ""
    #: installs Slurm's daemons and clients and munge (``scheduler=slurm``) where the image
    #: has none, or (``slurm_from_source``) what building them needs (docs/slurm-stack.md,
    #: "Slurm on the image")
    slurm_install: str = ""
    #: the OS has no Slurm package: ``bootstrap_scripts/agent/slurm_build.py`` builds munge and
    #: Slurm from their pinned sources after ``slurm_install``
    slurm_from_source: bool = False

    @property
    def mounts_tls(self) -> bool:
        """The node installs ``mount.efs`` at boot, so it can mount a TLS-only file system."""
        return bool(self.efs_utils_install)

    def ssm_parameter(self, pytorch_version: str) -> str:
        """The public SSM parameter of the latest DLAMI of this OS and PyTorch line."""
        return (f"/aws/service/deeplearning/ami/{ARCHITECTURE}/"
                f"oss-nvidia-driver-gpu-pytorch-{pytorch_version}-{self.os_suffix}/latest/ami-id")


#: AWS's download URL of the latest Mountpoint for Amazon S3 package for x86_64, without its
#: extension (``.rpm`` / ``.deb``): https://docs.aws.amazon.com/AmazonS3/latest/userguide/mountpoint-installation.html
MOUNT_S3_URL = f"https://s3.amazonaws.com/mountpoint-s3-release/latest/{ARCHITECTURE}/mount-s3"

#: The DLAMIs' Python: ``/opt/pytorch/bin/python`` carries torch + torchrun (the release
#: notes' ``python_location``).
DLAMI_PYTHON = "/opt/pytorch/bin/python"
#: Amazon Linux 2023 packages to build munge and Slurm from source
#: (``bootstrap_scripts/agent/slurm_build.py``): compilers, and the libraries of the plugins the
#: cluster uses (cgroup/v2 needs dbus, slurmdbd's MySQL plugin the MariaDB connector).
#: ``strict=0``: a name a release lacks is skipped, and Slurm's configure then says what it
#: disabled or what it needs.
SLURM_BUILD_PACKAGES_AL2023 = (
    "gcc make perl python3 bzip2 xz tar openssl-devel zlib-devel readline-devel pam-devel "
    "dbus-devel json-c-devel lz4-devel hwloc-devel mariadb-connector-c-devel")

#: PyTorch DLAMIs (OSS NVIDIA driver).
IMAGE_FAMILIES: dict[str, ImageFamily] = {
    "amazon-linux-2023": ImageFamily(
        os_suffix="amazon-linux-2023",
        root_device_name="/dev/xvda",
        python=DLAMI_PYTHON,
        default_pytorch="2.13",
        # amazon-efs-utils is an Amazon Linux 2023 repository package: reachable from a
        # private subnet through its NAT gateway like any other AL2023 update.
        efs_utils_install="dnf install -y -q amazon-efs-utils",
        pytorch_lines=("2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13"),
        # AL2023's repository has the agent's package (AWS: "Install the CloudWatch agent
        # on Amazon Linux 2023", install-CloudWatch-Agent-commandline-fileoverview.html).
        cloudwatch_agent_install="dnf install -y -q amazon-cloudwatch-agent",
        # AL2023's repository has mount-s3 from release 2023.9.20251110; an older image
        # installs AWS's own RPM from its download URL instead.
        mount_s3_install=f"dnf install -y -q mount-s3 || dnf install -y -q {MOUNT_S3_URL}.rpm",
        lustre_client_install="dnf install -y -q lustre-client",
        nftables_install="dnf install -y -q nftables",
        # No Slurm or munge package: the build tools, then munge and Slurm built from
        # pinned, checksummed sources on the node's own disk (docs/slurm-stack.md, "Slurm on
        # the image").
        slurm_install=f"dnf install -y -q --setopt=strict=0 {SLURM_BUILD_PACKAGES_AL2023}",
        slurm_from_source=True,
    ),
    "ubuntu": ImageFamily(
        os_suffix="ubuntu-24.04",
        root_device_name="/dev/sda1",
        python=DLAMI_PYTHON,
        default_pytorch="2.12",
        # Ubuntu's archive has no amazon-efs-utils (AWS documents building it from source);
        # without it the node mounts with plain NFS, which a TLS-only file system refuses.
        efs_utils_install="",
        pytorch_lines=("2.9", "2.10", "2.11", "2.12"),
        # Ubuntu has no agent package: AWS's own .deb from the region's download bucket
        # (reached through the VPC's S3 gateway endpoint), installed with dpkg -i -E
        # (download-CloudWatch-Agent-on-EC2-Instance-commandline-first.html).
        cloudwatch_agent_install=(
            "curl -fsSL -o /tmp/amazon-cloudwatch-agent.deb https://amazoncloudwatch-agent-"
            "{region}.s3.{region}.amazonaws.com/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb"
            " && dpkg -i -E /tmp/amazon-cloudwatch-agent.deb"),
        # AWS's .deb from its download URL, installed with apt-get (which pulls libfuse2).
        mount_s3_install=(f"curl -fsSL -o /tmp/mount-s3.deb {MOUNT_S3_URL}.deb && "
                          "apt-get install -y -q /tmp/mount-s3.deb"),
        # AWS's FSx client repository for Ubuntu 24.04 (noble), its signing key first, then
        # the client modules of the running kernel.
        lustre_client_install=(
            "curl -fsSL https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/"
            "fsx-ubuntu-public-key.asc | gpg --dearmor --yes -o "
            "/usr/share/keyrings/fsx-ubuntu-public-key.gpg && echo 'deb [signed-by=/usr/share/"
            "keyrings/fsx-ubuntu-public-key.gpg] https://fsx-lustre-client-repo.s3.amazonaws.com"
            "/ubuntu noble main' > /etc/apt/sources.list.d/fsxlustreclientrepo.list && "
            "apt-get update -q && apt-get install -y -q lustre-client-modules-$(uname -r)"),
        # Ubuntu 24.04's own packages: Slurm 23.11 and munge 0.5.15, signed by the archive.
        slurm_install=("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install "
                       "-y -q munge slurmd slurmctld slurmdbd slurm-client"),
        nftables_install=("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get "
                          "install -y -q nftables"),
    ),
}

#: The image family of the constructs' default machine image: the one whose OS installs
#: amazon-efs-utils at boot, so the default file system (TLS required) mounts.
DEFAULT_IMAGE_TYPE = "amazon-linux-2023"


def image_family(image_type: str) -> ImageFamily:
    try:
        return IMAGE_FAMILIES[image_type]
    except KeyError:
        known = ", ".join(sorted(IMAGE_FAMILIES))
        raise ConfigError(f"image_type must be one of {known}, got {image_type!r}") from None


def pytorch_version(name: str, value: object) -> str:
    """A PyTorch line as the DLAMI parameter names spell it: ``major.minor`` such as 2.13."""
    text = str(value).strip() if isinstance(value, (str, int, float)) else ""
    if not _PYTORCH_VERSION.match(text) or isinstance(value, bool):
        raise ConfigError(
            f"{name} must be a PyTorch version as the Deep Learning AMI parameter names spell "
            f"it (major.minor, e.g. 2.13), got {value!r}")
    return text


def published_pytorch(image_type: str, value: object, *, name: str = "pytorch_version",
                      os_name: str = "image_type") -> str:
    """``value`` as a PyTorch line with a DLAMI parameter for ``image_type``, or ConfigError
    naming both settings and the lines there are (an unpublished parameter would fail the
    deploy at CloudFormation's parameter resolution, after synth said nothing)."""
    family = image_family(image_type)
    version = pytorch_version(name, value)
    if version not in family.pytorch_lines:
        raise ConfigError(
            f"{name}={version!r} has no PyTorch Deep Learning AMI for {os_name}="
            f"{image_type!r} (no SSM parameter {family.ssm_parameter(version)}); the lines "
            f"AWS's release notes list for it: {', '.join(family.pytorch_lines)}. For another "
            f"image give a machine image (amiId)")
    return version


def check_image(image_type: str, version: object, *, public_image: bool,
                tls_only_file_system: bool) -> str | None:
    """The construct's image props checked together: ``version`` (the ``pytorch_version``
    prop) must have a DLAMI for ``image_type`` when the public image is used, and that OS
    must mount the cluster's new TLS-only file system (docs/node-agent.md, "Mounting EFS").
    Returns the checked version (None: the family's default)."""
    family = image_family(image_type)
    if version is not None:
        version = published_pytorch(image_type, version) if public_image else \
            pytorch_version("pytorch_version", version)
    if tls_only_file_system and public_image and not family.mounts_tls:
        raise ConfigError(
            f"image_type={image_type!r} with the default file system: the file system "
            f"refuses clients without TLS (efs_require_tls=True), and TLS to EFS needs "
            f"amazon-efs-utils, which the {image_type} Deep Learning AMI does not have and "
            f"its OS has no package for (AWS documents building it from source); use "
            f"image_type='amazon-linux-2023', a machine_image that has amazon-efs-utils, or "
            f"efs_require_tls=False (docs/node-agent.md, \"Mounting EFS\")")
    return version  # type: ignore[return-value]


def dlami_parameter(image_type: str = DEFAULT_IMAGE_TYPE, pytorch: str | None = None) -> str:
    """The SSM parameter name the default machine image of ``image_type`` resolves."""
    family = image_family(image_type)
    version = family.default_pytorch if pytorch is None else published_pytorch(
        image_type, pytorch)
    return family.ssm_parameter(version)


def deep_learning_ami(
    image_type: str = DEFAULT_IMAGE_TYPE,
    *,
    pytorch_version: str | None = None,
    ssm_parameter: str | None = None,
) -> ec2.IMachineImage:
    """The latest PyTorch Deep Learning AMI of ``image_type`` and ``pytorch_version`` (default:
    the family's newest documented line), resolved at deploy time from its public SSM
    parameter (or from ``ssm_parameter``). For an AMI id use :class:`FixedAmi`."""
    return ec2.MachineImage.from_ssm_parameter(
        ssm_parameter or dlami_parameter(image_type, pytorch_version),
        os=ec2.OperatingSystemType.LINUX,
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
