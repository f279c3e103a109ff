#!/usr/bin/env bash
# System packages the runner tests need (Debian/Ubuntu): a real sshd per emulated node and
# Open MPI for the MPI path (tests/runner/test_mpi.py), plus a C compiler for mpicc, and
# iptables: every node's boot keeps non-root processes away from its instance metadata
# (bootstrap_scripts/agent/imds_guard.py), on an emulated node as on an instance, and
# nftables: each node's executor keeps other users away from what a job listens on with a
# table of its own (bootstrap_scripts/jobs/executor/listen_guard.py).
# chromium (Debian's, with no recommended packages): the TensorBoard browser test drives it
# headless through Playwright (tests/ops/test_tensorboard_browser.py).
# Slurm 22.05 and munge (scheduler=slurm): the emulated nodes run the real daemons
# (tests/slurm/, docs/slurm-node.md).
# podman, skopeo and docker-registry (jobs from container images, docs/containers.md): an
# emulated node's rootless podman, the test's image push, and the registry the emulator runs
# as the account's ECR endpoint (emulator/registry.py). About 11 s on the offline mirror.
# Debian's docker-registry package enables a system service on :5000 (all addresses): it is
# stopped and disabled here, the emulator starts its own on loopback.
# Idempotent and quiet: installs only what is missing; does nothing when all is there.
# With arguments, only those packages (`make demo` asks for iptables alone).
set -euo pipefail

PACKAGES=(openssh-server openssh-client openmpi-bin libopenmpi-dev gcc iptables chromium
          slurmctld slurmd slurm-client munge podman skopeo docker-registry nftables)
#: installed without their recommended packages (a browser recommends a desktop's worth)
LEAN=(chromium)
if [ "$#" -gt 0 ]; then
    PACKAGES=("$@")
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
lean=() full=()
for pkg in "${missing[@]}"; do
    if [[ " ${LEAN[*]} " == *" $pkg "* ]]; then lean+=("$pkg"); else full+=("$pkg"); fi
done
if [ "${#full[@]}" -gt 0 ]; then
    $SUDO apt-get install -y -qq "${full[@]}" >/dev/null
fi
if [ "${#lean[@]}" -gt 0 ]; then
    $SUDO apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
fi
if [[ " ${missing[*]} " == *" docker-registry "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
fi
