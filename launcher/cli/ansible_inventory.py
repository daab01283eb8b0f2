"""`sparkstack ansible-inventory`: the ranks as an Ansible inventory for ansible/spark.yml."""

from __future__ import annotations

import click

from .shared import with_cluster


@click.command("ansible-inventory")
@with_cluster()
@click.option("--format", "fmt", type=click.Choice(["ini", "yaml"]), default="ini",
              show_default=True, help="inventory file format")
def ansible_inventory(loaded, fmt):
    """Print an Ansible inventory of the ranks for ansible/spark.yml.

    \b
    Hosts in rank order, reached as sparkstack reaches them (address, port, user, key, jump
    host; host keys checked against the config's known_hosts), with the node settings of
    launcher/inputs/node_settings.py as group vars. Apply the persistent node settings with:
      sparkstack ansible-inventory -c cluster.yaml > inventory.ini
      ANSIBLE_CONFIG=ansible/ansible.cfg ansible-playbook -i inventory.ini ansible/spark.yml
    """
    from ..inputs.config import no_swap
    from ..plan import inventory

    click.echo(inventory.render(loaded.cluster, fmt, no_swap(loaded)), nl=False)
