"""Image references, the allow rule and a rank's podman argv (pure, no podman needed)."""

from __future__ import annotations

import pytest

from bootstrap_scripts.containers import allow, podman_argv, reference
from bootstrap_scripts.containers.podman_argv import ArgvError, RankContainer
from bootstrap_scripts.containers.reference import BadReference, parse

DIGEST = "sha256:" + "ab" * 32
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


@pytest.mark.parametrize(("text", "registry", "path", "tag", "digest"), [
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io", "nvidia/pytorch", "24.05-py3", None),
    (f"{ECR}/team/train@{DIGEST}", ECR, "team/train", None, DIGEST),
    (f"{ECR}/team/train:v1@{DIGEST}", ECR, "team/train", "v1", DIGEST),
    ("ubuntu", "docker.io", "library/ubuntu", None, None),
    ("pytorch/pytorch:2.3.0", "docker.io", "pytorch/pytorch", "2.3.0", None),
    ("localhost:5000/img:latest", "localhost:5000", "img", "latest", None),
    ("127.0.0.1:5000/a/b__c.d-e", "127.0.0.1:5000", "a/b__c.d-e", None, None),
])
def test_well_formed_references_parse(text, registry, path, tag, digest):
    ref = parse(text)
    assert (ref.registry, ref.path, ref.tag, ref.digest) == (registry, path, tag, digest)


@pytest.mark.parametrize(("text", "names"), [
    ("", "required"),
    ("nvcr.io/NVIDIA/pytorch:1", "'NVIDIA'"),
    ("nvcr.io//pytorch", "component ''"),
    ("nvcr.io/pytorch:-bad", "tag '-bad'"),
    ("nvcr.io/pytorch:" + "x" * 129, "tag"),
    ("nvcr.io/pytorch@sha256:abc", "digest 'sha256:abc'"),
    (f"nvcr.io/pytorch@md5:{'a' * 64}", "digest"),
    ("nvcr.io/py torch", "spaces"),
    ("nvcr.io/pytorch\n", "spaces"),
    ("bad_host.io:x/img", "registry"),
    ("nvcr.io/a--/b", "'a--'"),
])
def test_malformed_references_are_refused_naming_the_part(text, names):
    with pytest.raises(BadReference, match=None) as caught:
        parse(text)
    assert names in str(caught.value)


def test_pinning_and_the_name_every_node_runs():
    ref = parse("nvcr.io/nvidia/pytorch:24.05")
    assert not ref.pinned
    with pytest.raises(BadReference):
        ref.pinned_name()
    with pytest.raises(BadReference):
        ref.with_digest("sha256:short")
    pinned = ref.with_digest(DIGEST)
    assert pinned.pinned_name() == f"nvcr.io/nvidia/pytorch@{DIGEST}"
    assert str(pinned) == f"nvcr.io/nvidia/pytorch:24.05@{DIGEST}"
    assert parse(str(pinned)) == pinned


def test_allow_rule_matches_repositories_and_prefixes_on_component_boundaries():
    entries = allow.parse_entries(f" nvcr.io/nvidia/ , {ECR}/team/train,, ")
    assert entries == ("nvcr.io/nvidia", f"{ECR}/team/train")
    allow.check(entries, parse("nvcr.io/nvidia/pytorch:1"))
    allow.check(entries, parse(f"{ECR}/team/train@{DIGEST}"))
    for refused in ("nvcr.io/nvidiaevil/x:1", f"{ECR}/team/trainer:1", f"{ECR}/other:1",
                    "ubuntu"):
        with pytest.raises(allow.ImageNotAllowed) as caught:
            allow.check(entries, parse(refused))
        assert parse(refused).repository in str(caught.value)
        assert allow.SETTING in str(caught.value)


def test_an_empty_allow_list_refuses_every_image():
    with pytest.raises(allow.ImageNotAllowed, match="allowedImages setting is empty"):
        allow.check(allow.parse_entries(""), parse("nvcr.io/nvidia/pytorch:1"))


def _rank(**changes) -> RankContainer:
    fields = {"image": parse(f"nvcr.io/nvidia/pytorch@{DIGEST}"),
              "command": ("python", "train.py", "--epochs", "2"), "workdir": "/mnt/efs/jobs/1",
              "mounts": ("/mnt/efs", "/mnt/efs/jobs/1", "/data"), "gpus": True,
              "devices": ("/dev/infiniband/uverbs0",),
              "env_names": ("DEEPLEARNING_NODE_RANK", "MASTER_ADDR", "NCCL_DEBUG")}
    fields.update(changes)
    return RankContainer(**fields)


def test_argv_runs_the_pinned_image_as_the_user_on_the_hosts_network():
    args = podman_argv.argv(_rank())
    image_at = args.index(f"nvcr.io/nvidia/pytorch@{DIGEST}")
    options, command = args[:image_at], args[image_at + 1:]
    assert command == ["python", "train.py", "--epochs", "2"]
    assert options[:2] == ["podman", "run"]
    for flag in ("--userns=keep-id", "--network=host", "--ipc=host", "--pull=never",
                 "--cap-drop=all", "--security-opt=no-new-privileges", "--rm",
                 "--workdir=/mnt/efs/jobs/1", "--volume=/mnt/efs:/mnt/efs",
                 "--volume=/data:/data", "--device=nvidia.com/gpu=all",
                 "--device=/dev/infiniband/uverbs0", "--env=MASTER_ADDR", "--env=NCCL_DEBUG",
                 "--env=DEEPLEARNING_NODE_RANK"):
        assert flag in options
    assert not any("privileged" in o or "bridge" in o or "docker.sock" in o for o in options)
    assert not any(o.startswith("--env=") and "=" in o.removeprefix("--env=") for o in options)


def test_argv_refuses_what_it_cannot_describe_safely():
    with pytest.raises(ArgvError, match="not pinned"):
        podman_argv.argv(_rank(image=parse("nvcr.io/nvidia/pytorch:1")))
    with pytest.raises(ArgvError, match="command"):
        podman_argv.argv(_rank(command=()))
    with pytest.raises(ArgvError, match="mount"):
        podman_argv.argv(_rank(mounts=("/data:/etc",)))
    with pytest.raises(ArgvError, match="mount"):
        podman_argv.argv(_rank(mounts=("relative",)))
    with pytest.raises(ArgvError, match="device"):
        podman_argv.argv(_rank(devices=("/etc/shadow",)))
    with pytest.raises(ArgvError, match="AWS_SECRET_ACCESS_KEY"):
        podman_argv.argv(_rank(env_names=("AWS_SECRET_ACCESS_KEY",)))
    assert "--device=nvidia.com/gpu=all" not in podman_argv.argv(_rank(gpus=False))


def test_passed_env_takes_the_jobs_variables_and_never_static_secrets():
    environ = {"DEEPLEARNING_WORKERS_COUNT": "2", "RANK": "0", "NCCL_SOCKET_IFNAME": "lo",
               "FI_PROVIDER": "efa", "TORCHELASTIC_RUN_ID": "x", "AWS_CONFIG_FILE": "/c",
               "AWS_SECRET_ACCESS_KEY": "s", "AWS_ACCESS_KEY_ID": "k", "LD_PRELOAD": "/x.so",
               "PATH": "/usr/bin", "PYTHONPATH": "/p", "SSH_AUTH_SOCK": "/s"}
    assert podman_argv.passed_env(environ) == (
        "AWS_CONFIG_FILE", "DEEPLEARNING_WORKERS_COUNT", "FI_PROVIDER", "NCCL_SOCKET_IFNAME",
        "RANK", "TORCHELASTIC_RUN_ID")


def test_mounts_for_skips_unset_and_repeated_paths():
    assert podman_argv.mounts_for(["/mnt/efs", None, "", "/data", "/mnt/efs"]) == (
        "/mnt/efs", "/data")
    assert reference.DEFAULT_REGISTRY == "docker.io"
