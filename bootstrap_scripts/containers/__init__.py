"""Jobs from container images: reference parsing, the stack's allow rule, podman's argv.

Every rank of an image job runs under rootless podman as the job's own user (never a root
daemon, never the docker group, which is root); docs/containers.md says what is built.
"""
