#!/bin/bash
# EMR bootstrap action: mount the cluster's EFS file system on this node.
#
#   efs_mount.sh <fs-id> <region> [mount-point]      (mount point default: /efs)
#
# Runs on every node (primary and core) before EMR installs its applications, as the
# hadoop user with passwordless sudo. It:
#   1. waits until the file system AND its mount targets are "available" (a cluster created
#      in the same deployment as the file system boots before the mount targets are ready;
#      the original template's bootstrap action did not wait, and the whole cluster failed),
#   2. mounts it: efs-utils with TLS and IAM authorisation where available (installed from the
#      Amazon Linux repositories if missing), else NFS 4.1 with AWS's recommended options,
#   3. hands the mount point to hadoop (the user EMR steps, and so dl-run, run as),
#   4. fails the bootstrap action (and so the cluster start) with a clear message if the
#      file system is not in /proc/mounts afterwards.
# Exit status: 0 mounted, 2 usage, 3 file system not available in time, 4 mount failed.
#
# Tunables (environment): EFS_WAIT_ATTEMPTS (default 90), EFS_WAIT_INTERVAL (seconds,
# default 10), EFS_OWNER (default hadoop:hadoop), EFS_PROC_MOUNTS (default /proc/mounts).
set -euo pipefail

NFS_OPTIONS="nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport"
ATTEMPTS="${EFS_WAIT_ATTEMPTS:-90}"
INTERVAL="${EFS_WAIT_INTERVAL:-10}"
OWNER="${EFS_OWNER:-hadoop:hadoop}"
PROC_MOUNTS="${EFS_PROC_MOUNTS:-/proc/mounts}"

say() { echo "emr_efs_mount: $*"; }
die() { local code="$1"; shift; echo "emr_efs_mount: ERROR: $*" >&2; exit "$code"; }

if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    die 2 "usage: efs_mount.sh <fs-id> <region> [mount-point], got $# argument(s): $*"
fi
FS_ID="$1"
REGION="$2"
MOUNT_POINT="${3:-/efs}"
[[ "$FS_ID" =~ ^fs-[0-9a-f]{8,40}$ ]] || die 2 "'$FS_ID' is not an EFS file system id (fs-0123456789abcdef0)"
[[ "$REGION" =~ ^[a-z]{2}(-[a-z]+)+-[0-9]+$ ]] || die 2 "'$REGION' is not an AWS region (e.g. us-east-1)"
[[ "$MOUNT_POINT" == /* && "$MOUNT_POINT" != "/" ]] || die 2 "mount point '$MOUNT_POINT' must be an absolute directory other than /"
MOUNT_POINT="${MOUNT_POINT%/}"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

in_proc_mounts() {
    # Field 2 of /proc/mounts is the mount point; an exact match, not a prefix.
    awk -v mp="$MOUNT_POINT" '$2 == mp { found = 1 } END { exit !found }' "$PROC_MOUNTS"
}

file_system_ready() {
    local fs_state mt_states
    fs_state="$(aws efs describe-file-systems --region "$REGION" --file-system-id "$FS_ID" \
        --query 'FileSystems[0].LifeCycleState' --output text 2>&1)" || {
        say "describe-file-systems failed: $fs_state"; return 1; }
    if [ "$fs_state" != "available" ]; then
        say "file system $FS_ID is '$fs_state', waiting"; return 1
    fi
    mt_states="$(aws efs describe-mount-targets --region "$REGION" --file-system-id "$FS_ID" \
        --query 'MountTargets[].LifeCycleState' --output text 2>&1)" || {
        say "describe-mount-targets failed: $mt_states"; return 1; }
    if [ -z "$mt_states" ] || [ "$mt_states" = "None" ]; then
        say "file system $FS_ID has no mount targets yet, waiting"; return 1
    fi
    local s
    for s in $mt_states; do
        if [ "$s" != "available" ]; then
            say "mount targets of $FS_ID are '$mt_states', waiting"; return 1
        fi
    done
    return 0
}

if mountpoint -q "$MOUNT_POINT" 2>/dev/null && in_proc_mounts; then
    say "$MOUNT_POINT is already mounted; nothing to do"
    exit 0
fi

attempt=1
until file_system_ready; do
    if [ "$attempt" -ge "$ATTEMPTS" ]; then
        die 3 "EFS $FS_ID in $REGION (file system and mount targets) was not available after $ATTEMPTS checks ${INTERVAL}s apart; check that it exists in this region, that it has a mount target in this node's subnet, and that the instance role may call elasticfilesystem:DescribeFileSystems/DescribeMountTargets"
    fi
    attempt=$((attempt + 1))
    sleep "$INTERVAL"
done
say "file system $FS_ID and its mount targets are available"

if ! command -v mount.efs >/dev/null 2>&1; then
    # Amazon Linux 2023 (the base of EMR 7 custom AMIs) ships amazon-efs-utils.
    if command -v dnf >/dev/null 2>&1; then
        $SUDO dnf install -y -q amazon-efs-utils >/dev/null 2>&1 || say "could not install amazon-efs-utils"
    fi
fi

$SUDO mkdir -p "$MOUNT_POINT"
if command -v mount.efs >/dev/null 2>&1; then
    say "mounting $FS_ID at $MOUNT_POINT with efs-utils (TLS, IAM)"
    mount_cmd=(mount -t efs -o tls,iam "$FS_ID:/" "$MOUNT_POINT")
else
    say "efs-utils not available: mounting with NFS 4.1 without TLS (a file system that requires TLS will refuse this)"
    mount_cmd=(mount -t nfs4 -o "$NFS_OPTIONS" "$FS_ID.efs.$REGION.amazonaws.com:/" "$MOUNT_POINT")
fi
if ! out="$($SUDO "${mount_cmd[@]}" 2>&1)"; then
    die 4 "'${mount_cmd[*]}' failed: $out"
fi
if ! in_proc_mounts; then
    die 4 "'${mount_cmd[*]}' returned success but $MOUNT_POINT is not in $PROC_MOUNTS; EFS $FS_ID is NOT mounted"
fi
$SUDO chown "$OWNER" "$MOUNT_POINT"
say "mounted $FS_ID at $MOUNT_POINT (owner $OWNER)"
