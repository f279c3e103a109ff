"""The emulated account's network (``emulator.address_space``): a loopback /16 of its own, so
two emulated accounts on one host (the test suite's parallel workers) never hand two nodes the
same address; never given to a node."""

from __future__ import annotations

import pytest

from emulator import address_space as net
from emulator.node_inputs import base_env
from emulator.resources import loopback_instances


def test_default_vpc_its_subnets_and_the_runner_s_range(monkeypatch):
    monkeypatch.delenv(net.VPC_CIDR_ENV, raising=False)
    assert net.vpc_cidr() == "127.20.0.0/16"
    assert net.subnets() == (("127.20.0.0/18", "127.20.64.0/18"),
                             ("127.20.128.0/18", "127.20.192.0/18"))
    assert net.loopback_prefix() == "127.21"
    assert all(i.address.startswith("127.21.") for i in loopback_instances(3))


def test_another_account_s_network_is_used_everywhere(monkeypatch):
    monkeypatch.setenv(net.VPC_CIDR_ENV, "127.22.0.0/16")
    assert net.subnets()[1] == ("127.22.128.0/18", "127.22.192.0/18")
    master, *workers = loopback_instances(3)
    assert master.address.startswith("127.23.0.")
    assert all(w.address.startswith("127.23.128.") for w in workers)


@pytest.mark.parametrize("bad", ["10.0.0.0/16", "127.20.0.0/17", "127.254.0.0/16", "nope"])
def test_a_network_no_node_could_bind_is_refused_naming_it(monkeypatch, bad):
    monkeypatch.setenv(net.VPC_CIDR_ENV, bad)
    with pytest.raises(ValueError, match=f"{net.VPC_CIDR_ENV}='{bad}'"):
        net.vpc_cidr()


def test_a_node_is_not_told_the_emulator_s_network(monkeypatch):
    monkeypatch.setenv(net.VPC_CIDR_ENV, "127.22.0.0/16")
    assert net.VPC_CIDR_ENV not in base_env()


def test_parallel_accounts_take_every_second_16_each_one_valid(monkeypatch):
    nets = [net.vpc_for(i) for i in range(117)]
    assert nets[:3] == ["127.20.0.0/16", "127.22.0.0/16", "127.24.0.0/16"]
    runner = set()
    for cidr in nets:
        monkeypatch.setenv(net.VPC_CIDR_ENV, cidr)
        assert net.vpc_cidr() == cidr
        runner.add(net.loopback_prefix())
    assert not runner & {c.rsplit(".", 2)[0] for c in nets}  # no /16 used twice
    with pytest.raises(ValueError, match="account 117"):
        net.vpc_for(117)
    with pytest.raises(ValueError, match="account -1"):
        net.vpc_for(-1)
