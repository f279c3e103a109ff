"""The emulated node's podman settings (pure text) and its wrapper's shape.

The files are what podman reads on an emulated node (docs/emulator.md, "running a container
on a node"); the real run through them is tests/containers/test_real_podman.py.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from emulator import container_host, registry


def test_the_node_gets_no_cgroups_explicit_limits_and_its_own_stores(tmp_path: Path) -> None:
    root = tmp_path / "node"
    wrapper = container_host.install_podman(root, root / "usr/bin", ["127.0.0.1:5999"])
    conf = root / container_host.CONF_DIR
    containers = tomllib.loads((conf / "containers.conf").read_text())["containers"]
    assert containers == {"cgroups": "disabled",
                          "default_ulimits": ["nofile=1024:1024", "nproc=1000:1000"]}
    registries = tomllib.loads((conf / "registries.conf").read_text())
    assert registries["registry"] == [{"location": "127.0.0.1:5999", "insecure": True}]
    assert registries["unqualified-search-registries"] == []
    storage = tomllib.loads((conf / "storage.conf").read_text())["storage"]
    assert storage["rootless_storage_path"].startswith(str(root))
    text = wrapper.read_text()
    assert text.rstrip().endswith(f'exec {container_host.REAL_PODMAN} "$@"')
    runtime = container_host.runtime_base(root)
    # short, whatever the node's root (a long one made every podman run wait 20 s)
    assert str(runtime) in text and len(str(runtime)) < 32
    container_host.remove_podman(root)
    assert not runtime.exists()


def test_the_namespace_hides_the_hosts_cgroups_before_the_command() -> None:
    argv = container_host.in_node_namespace(["id", "-u"])
    assert argv[:2] == ["unshare", "--mount"]
    assert argv[-2:] == ["id", "-u"]
    script = argv[argv.index("-c") + 1]
    assert script.index("/sys/fs/cgroup") < script.index('exec "$@"')


def test_the_registry_listens_on_its_address_only(tmp_path: Path) -> None:
    conf = json.loads(registry.config("127.0.0.9", 5123, tmp_path))
    assert conf["http"]["addr"] == "127.0.0.9:5123"
    assert conf["storage"]["filesystem"]["rootdirectory"] == str(tmp_path)
