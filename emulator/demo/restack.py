"""A kept cluster's account after ``dlc down`` and ``dlc up``: AWS launches the new stack's
instances, so the kept service boots them.

On AWS, Auto Scaling and EC2 act for every group in the account: after ``dlc down`` deletes
the stack (its groups terminate their instances) and ``dlc up`` deploys it again, the new
groups' instances boot from their launch templates' user data, the groups publish their
launches to the new stack's topic, and the new nodes mount the new stack's file system.
The kept service (``emulator.demo.keeper``) plays Auto Scaling for the groups of the stack it
read at the start; :class:`StackFollower` notices when that stack was replaced (a new
``StackId``, ``CREATE_COMPLETE``) and plays the new one the same way the demo played the
first (``emulator.demo.cluster``): reads the deployed resources, boots one node per launched
instance, delivers the launch notifications to the new capacity-adjuster function and goes
on ticking the new groups.

The file system: the demo's nodes all mount one directory (``work/efs``). A new stack that
created a new file system (its ``FileSystemId`` output differs) gets an empty one, as on
AWS; the old one, which the old stack RETAINed, stays in ``work/efs-<file system id>``
(no node mounts it). Nothing of the product is done here: whether the new cluster forms,
and what its jobs can read, is the product's and IAM's business.
"""

from __future__ import annotations

import os
import time
from typing import Any

from botocore.exceptions import ClientError

from emulator import deploy as dp

#: How often the service asks CloudFormation whether the stack was replaced (seconds).
CHECK_EVERY_S = 2.0


class StackFollower:
    """Adopts a replaced stack for the kept service; ``demo`` is the kept demo's context."""

    def __init__(self, demo: Any) -> None:
        self.demo = demo
        self.stack_id = self.current()[0]
        self.checked = 0.0

    def current(self) -> tuple[str, str]:
        """(StackId, StackStatus) of the stack, ("", "") while there is none."""
        cfn = self.demo.session().client("cloudformation")
        try:
            stack = cfn.describe_stacks(StackName=dp.STACK)["Stacks"][0]
        except ClientError:
            return "", ""
        return stack["StackId"], stack["StackStatus"]

    def tick(self) -> Any | None:
        """The new :class:`~emulator.autoscaling.AutoScaling` once a replaced stack is up
        and its nodes booted; None while nothing changed (or the old machines still run)."""
        now = time.monotonic()
        if now - self.checked < CHECK_EVERY_S:
            return None
        self.checked = now
        stack_id, status = self.current()
        if not stack_id or stack_id == self.stack_id or status != "CREATE_COMPLETE":
            return None
        running = [n.instance_id for n in self.demo.nodes if n.status == "running"]
        if running:  # the old stack's machines stop first (its instances were terminated)
            self.demo.console.print(f"stack {dp.STACK} replaced; waiting for the old "
                                    f"machines to stop: {', '.join(running)}")
            return None
        self.stack_id = stack_id
        return adopt(self.demo)


def retire_file_system(demo: Any, old: str, new: str) -> None:
    """The new stack mounts its new (empty) file system; the old one's files stay in
    ``work/efs-<old id>``."""
    if not old or old == new or not demo.efs.exists():
        return
    st = demo.efs.stat()
    kept = demo.work / f"efs-{old}"
    demo.efs.rename(kept)
    demo.efs.mkdir()
    os.chown(demo.efs, st.st_uid, st.st_gid)
    demo.efs.chmod(st.st_mode & 0o7777)
    demo.console.print(f"file system {new} is new: mounted empty; {old}'s files (RETAINed "
                       f"by the old stack) stay in {kept}")


def adopt(demo: Any) -> Any:
    """Play the replaced stack: read it, boot its instances, announce their launches."""
    from emulator.demo import cluster

    old_fs = (demo.cluster.outputs.get("FileSystemId", "") if demo.cluster else "")
    demo.console.print(f"stack {dp.STACK} was replaced (dlc down, dlc up): playing Auto "
                       "Scaling and EC2 for its groups")
    demo.cluster = dp.read_cluster(demo.session())
    retire_file_system(demo, old_fs, demo.cluster.outputs.get("FileSystemId", ""))
    demo.membership = None
    demo.failed_launches = []  # the old stack's
    cluster.boot_nodes(demo)
    cluster.notify_launches(demo)
    demo.autoscaling = cluster.autoscaling(demo)
    demo.save_state()
    return demo.autoscaling
