"""Addresses and names from cluster.yaml reach shell command lines (the relay on rank 0), SSH and
Ansible inventories: only a host name or an IP address is let in, at load, with the field's path."""

import pytest
from click.testing import CliRunner

from launcher.inputs import config
from launcher.cli.commands import main


def rank(i, **fields):
    return lambda d: d["ranks"][i].update(fields)


REFUSED = {
    "rendezvous with a command": (lambda d: d.update(rendezvous="10.0.0.11$(touch /tmp/x)"),
                                  "rendezvous: expected a host name"),
    "rendezvous with a space": (lambda d: d.update(rendezvous="10.0.0.11 -o x"), "rendezvous: expected a host name"),
    "address with a command": (rank(1, address="10.0.0.12;id"), "ranks[1].address: expected a host name"),
    "address with an IPv6 zone": (rank(1, address="fe80::1%eth0 x"), "ranks[1].address: expected a host name"),
    "empty address": (rank(1, address=""), "ranks[1].address: expected a host name"),
    "address label too long": (rank(1, address="a" * 64 + ".lan"), "ranks[1].address: expected a host name"),
    "name with inventory variables": (rank(0, name="spark1 ansible_connection=local"),
                                      "ranks[0].name: expected a name of letters, digits, '-', '_' and '.'"),
    "name with a template": (rank(0, name="{{ lookup('pipe','id') }}"), "ranks[0].name: expected a name"),
    "jump port 0": (rank(3, jump="admin@bastion.lan:0"), "ranks[3].jump: expected host, user@host, host:port or user@host:port"),
    "jump port too high": (rank(3, jump="bastion.lan:65536"), "ranks[3].jump: expected host, user@host, host:port or user@host:port"),
    "jump port not a number": (rank(3, jump="bastion.lan:ssh"), "ranks[3].jump: expected host, user@host, host:port or user@host:port"),
    "jump with an option": (rank(3, jump="-oProxyCommand=id"), "ranks[3].jump: expected host, user@host, host:port or user@host:port"),
    "jump user with a space": (rank(3, jump="a b@bastion.lan"), "ranks[3].jump: expected host, user@host, host:port or user@host:port"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refused_at_load_naming_the_field(write_config, case):
    edit, message = REFUSED[case]
    path = write_config(edit)
    result = CliRunner().invoke(main, ["plan", "-c", str(path), "--offline"])
    assert result.exit_code == 2, result.output
    assert f"{path}: {message}" in result.output and "Traceback" not in result.output


ACCEPTED = {
    "host names": lambda d: (d.update(rendezvous="spark1.lan"), d["ranks"][1].update(address="spark-2")),
    "IPv6": lambda d: d["ranks"][2].update(address="fd00::13"),
    "names": lambda d: d["ranks"][0].update(name="spark_1.rack-a"),
    "jump forms": lambda d: [d["ranks"][i].update(jump=j) for i, j in
                             ((1, "bastion"), (2, "admin@10.0.0.1"), (3, "admin.x@bastion.lan:65535"))],
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_host_names_and_addresses_are_taken(write_config, case):
    config.load(write_config(ACCEPTED[case]))
