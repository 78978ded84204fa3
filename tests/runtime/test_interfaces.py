"""`gloo_env` (viceroy/runtime/interfaces.py): on a mesh spanning hosts an agent gives its ranks
GLOO_SOCKET_IFNAME naming the interface toward rank 0's host, checked against iproute2's own view of
this machine. (Across real network namespaces, with gloo: tests/launchers/test_host_loss_netns.py.)"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from viceroy.runtime.interfaces import gloo_env, interface_of, source_address


def _non_loopback_ipv4() -> tuple[str, str]:
    """(interface, address) of one of this machine's non-loopback IPv4 addresses, per `ip`."""
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip")
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        name, address = fields[1], fields[3].split("/")[0]
        if not address.startswith("127."):
            return name, address
    pytest.skip("this machine has no non-loopback IPv4 address")


def test_a_master_on_another_address_names_the_interface_holding_the_route():
    name, address = _non_loopback_ipv4()
    assert source_address(address) == address
    assert interface_of(address) == name
    assert gloo_env({"MASTER_ADDR": address}) == {"GLOO_SOCKET_IFNAME": name}


@pytest.mark.parametrize("master", ["127.0.0.1", "localhost"])
def test_a_master_on_loopback_leaves_gloo_alone(master):
    assert gloo_env({"MASTER_ADDR": master}) == {}


def test_the_users_own_choice_stands():
    _, address = _non_loopback_ipv4()
    assert gloo_env({"MASTER_ADDR": address, "GLOO_SOCKET_IFNAME": "ib0"}) == {}


def test_no_master_changes_nothing():
    assert gloo_env({}) == {}
