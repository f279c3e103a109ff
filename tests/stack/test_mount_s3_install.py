"""Every node installs Mountpoint for Amazon S3 (``dl-run --mount``) the way AWS documents
for its image, with the user data's retries, and goes on booting when it cannot."""

from __future__ import annotations

import pytest

from constructs_lib.images import IMAGE_FAMILIES, MOUNT_S3_URL
from constructs_lib.user_data import RETRY_FUNCTION, render_bootstrap_commands


@pytest.mark.parametrize("image_type, install", [
    ("amazon-linux-2023", f"dnf install -y -q mount-s3 || dnf install -y -q {MOUNT_S3_URL}.rpm"),
    ("ubuntu", f"curl -fsSL -o /tmp/mount-s3.deb {MOUNT_S3_URL}.deb && "
               "apt-get install -y -q /tmp/mount-s3.deb"),
])
def test_each_image_installs_mount_s3_with_retries(image_type, install):
    family = IMAGE_FAMILIES[image_type]
    assert family.mount_s3_install == install
    lines = render_bootstrap_commands(asset_s3_url="s3://b/k.zip", agent_settings={},
                                      mount_s3_install=family.mount_s3_install)
    (line,) = [x for x in lines if "mount-s3 install failed" in x]
    assert line.startswith("command -v mount-s3 >/dev/null || retry sh -c '")
    assert install in line
    # after the retry function is defined, before the installer replaces the shell
    assert lines.index(RETRY_FUNCTION) < lines.index(line) < len(lines) - 1
    assert MOUNT_S3_URL == "https://s3.amazonaws.com/mountpoint-s3-release/latest/x86_64/mount-s3"


def test_no_install_line_without_a_command():
    lines = render_bootstrap_commands(asset_s3_url="s3://b/k.zip", agent_settings={})
    assert not [x for x in lines if "mount-s3" in x]
