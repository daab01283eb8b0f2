"""`sparkstack init HOST1 HOST2 ...`: from host names to a checked cluster.yaml."""

from __future__ import annotations

import dataclasses
import datetime
import getpass
import json
import sys
from pathlib import Path

import click

from ..errors import load_yaml
from ..status import Status
from .console import err, friendly_errors, out


def _say(line: str) -> None:
    err.print(line, markup=False, highlight=False)


@click.command()
@click.argument("hosts", nargs=-1, required=True)
@click.option("--user", default=None, help="the login on every host (default: yours here)")
@click.option("--key", type=click.Path(path_type=Path), default=Path("~/.ssh/id_ed25519"), show_default=True,
              help="your private key; its .pub is installed where only a password logs in")
@click.option("--known-hosts", type=click.Path(path_type=Path), default=Path("~/.ssh/known_hosts"),
              show_default=True, help="host keys are checked against (and trusted ones added to) this file")
@click.option("--trust-new-hosts", is_flag=True, help="trust unknown host keys without asking (fingerprints printed)")
@click.option("--password-stdin", is_flag=True, help="read the login password (one line) from stdin, for scripts")
@click.option("--password-to-new-hosts", is_flag=True,
              help="with --yes or --password-stdin: send the password to hosts whose key was trusted in "
                   "this run too (a person at a terminal is asked instead)")
@click.option("--profile", "profile_name", default=None, help="the serving profile (`sparkstack profiles`)")
@click.option("--model-path", default=None, help="the checkpoint directory, the same path on every rank")
@click.option("--fabric-net", default="192.168.177.0/24", show_default=True,
              help="where proposed fabric addresses come from (a ring: a /30 or /31 per cable; a switch: this subnet)")
@click.option("--prefix", type=click.Choice(["30", "31"]), default="30", show_default=True,
              help="a ring cable's subnet: /30 (every stack reads it alike) or /31 (RFC 3021 point-to-point)")
@click.option("--twins", type=click.Choice(["first", "both"]), default="first", show_default=True,
              help="address each port's first netdev only (one PCIe x4 link, ~100G) or both twins (200G)")
@click.option("--mtu", type=click.IntRange(1280, 9216), default=9000, show_default=True,
              help="the fabric ports' MTU, in the netplan file and applied now")
@click.option("--apply", "--apply-network", "apply_network", is_flag=True,
              help="write the netplan file on every rank (ansible/fabric.yml) and apply the addresses; "
                   "without it init asks (--yes: not applied)")
@click.option("--dry-run", is_flag=True, help="discover and print what would be written; change nothing")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("cluster.yaml"), show_default=True)
@click.option("--force", is_flag=True, help="overwrite --output if it exists")
@click.option("--sysfs-root", default="/", hidden=True, help="the sandbox's fixture sysfs")
@click.option("--merge", type=click.Path(exists=True, path_type=Path), default=None,
              help="a YAML file of more cluster.yaml sections (container:, images:, ...) to include")
@click.option("--ship/--no-ship", "do_ship", default=None,
              help="put the serving image on every rank before `check` (check fails its image row until "
                   "then; `up` would ship it too); without either, init asks (--yes: not shipped)")
@click.option("--no-check", is_flag=True, help="do not run `check` at the end")
@click.option("-y", "--yes", is_flag=True, help="ask nothing: flags give every answer")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@friendly_errors
def init(hosts, user, key, known_hosts, trust_new_hosts, password_stdin, password_to_new_hosts, profile_name, model_path,
         fabric_net, prefix, twins, mtu, apply_network, dry_run, output, force, sysfs_root, merge, do_ship, no_check,
         yes, as_json):
    """Connect to each host (rank 0 first), install your key, probe, discover the CX7 cabling,
    address the fabric, write cluster.yaml, ship the image and run `check` on it.

    It asks (each answer has a flag, and --yes asks nothing): the profile and checkpoint path,
    each unknown host key, the password once where your key does not log in yet, whether to write
    the proposed netplan files and apply them (--apply; each rank's file and ports are journaled
    there first, and `sparkstack restore` puts them back), whether to ship the image (--ship).

    \b
    A new cluster: sparkstack init spark1 spark2 spark3 spark4 --user spark
    then `sparkstack fetch ORG/NAME` (the checkpoint, once, where it is not there yet),
    `sparkstack check` and `sparkstack up`.
    """
    from ..facts import cabling
    from ..init import bringup, hosts as hosts_mod, journal
    from ..plan import init_journal as jr
    from ..inputs.profile import profile_names
    from ..transport.remote import Target

    if output.exists() and not (force or dry_run):
        raise hosts_mod.InitInputError(f"{output} exists; pass --force to overwrite it or -o another path")
    extra = load_yaml(merge, "merge") if merge else {}  # before anything is asked or reached
    password = sys.stdin.readline().rstrip("\n") if password_stdin else None
    ask = hosts_mod.Prompts(
        say=_say,
        confirm=(lambda q: False) if yes else (lambda q: click.confirm(q, err=True)),
        password=(lambda q: password) if (password_stdin or yes) else (lambda q: getpass.getpass(q + ": ")),
        interactive=not (password_stdin or yes), password_to_new_hosts=password_to_new_hosts)
    user = user or getpass.getuser()
    if yes and not (profile_name and model_path):
        missing = [f for f, v in (("--profile", profile_name), ("--model-path", model_path)) if not v]
        raise hosts_mod.InitInputError(f"--yes asks nothing, and {' and '.join(missing)} "
                                       f"{'are' if len(missing) > 1 else 'is'} missing: pass the "
                                       "serving profile (`sparkstack profiles`) and the checkpoint directory")
    if not profile_name:
        profile_name = click.prompt(f"profile ({', '.join(profile_names())})", default="keys-1m-dcp4", err=True)
    if not model_path:
        model_path = click.prompt("checkpoint directory (the same path on every rank)", err=True)
    answers = bringup.Answers(user=user, key=key.expanduser(), known_hosts=known_hosts.expanduser(),
                              profile=profile_name, model_path=model_path, output=output,
                              fabric_net=fabric_net, sysfs_root=sysfs_root,
                              extra=extra)
    if not answers.key.exists():
        raise hosts_mod.InitInputError(f"no key {answers.key}; make one with `ssh-keygen -t ed25519` or pass --key")

    cache: dict = {}
    logins = {}
    for i, host in enumerate(hosts):
        address, port = bringup.split_host(host)
        t = Target(i, f"rank {i}", address, port, user, answers.key)
        logins[host] = hosts_mod.ensure_login(t, answers.known_hosts, trust_new_hosts, ask, cache)
        _say(f"rank {i} {host}: " + ("key login works" if logins[host] == "key" else "key installed (password login)"))
    cache.clear()

    loaded = bringup.load_doc(bringup.provisional(list(hosts), answers), output.resolve().parent)
    facts = bringup.probe_all(loaded)
    declared = bringup.declared_sysfs_root(facts, answers)
    if declared:  # sandbox ranks: the config says so, as `sandbox up`'s does (ansible treats them as such)
        answers = dataclasses.replace(answers, sysfs_root=declared)
        loaded = bringup.load_doc(bringup.provisional(list(hosts), answers), output.resolve().parent)
    from ..gather import probe

    with probe.open_group(loaded) as group:
        sudo = [p for p in (hosts_mod.sudo_problem(c, user, f"rank {i} ({hosts[i]})")
                            for i, c in enumerate(group.connections)) if p]
    for line in sudo:
        _say(line)
    tables = bringup.neighbours(loaded, facts)
    labels = {i: h for i, h in enumerate(hosts)}
    found = cabling.discover(facts, tables, labels)
    _print_cabling(found, labels)
    if found.topology is None:
        raise hosts_mod.InitError("no cabling found between the ranks:\n" + "\n".join(found.problems))
    try:
        addresses = cabling.propose(found, facts, fabric_net, int(prefix), twins)
    except ValueError as e:
        raise hosts_mod.InitInputError(str(e)) from None
    result = {"logins": logins, "cabling": found.to_json(), "sudo": sudo, "mtu": mtu, "prefix": int(prefix),
              "twins": twins, "addresses": [{"rank": a.rank, "netdev": a.netdev, "address": a.cidr,
                                             "existing": a.existing} for a in addresses]}
    _print_proposal(cabling.summary(found.topology, fabric_net, int(prefix), twins, mtu), addresses, labels)
    new = any(not a.existing for a in addresses)
    if dry_run:
        for r in range(len(hosts)):
            _say(f"--- rank {r} {hosts[r]}: {cabling.NETPLAN_FILE}")
            _say(cabling.netplan(addresses, r, mtu))
        _say(f"--apply journals these files and ports as they are first ({jr.RANK_PATH} on each rank, a copy "
             "here): `sparkstack restore` puts them back")
    elif apply_network or (new and not yes and click.confirm(
            f"write {cabling.NETPLAN_FILE} on every rank and apply these addresses now?", default=True, err=True)):
        with probe.open_group(loaded) as group:  # what it changes, as it is, before anything changes
            kept = journal.record(loaded, group, journal.touched(addresses))
        for r, path in sorted(kept.items()):
            _say(f"journaled rank {r} ({labels[r]}): {jr.RANK_PATH} there, {path} here")
        result["journal"] = {str(r): str(path) for r, path in sorted(kept.items())}
        for line in bringup.apply_addresses(loaded, addresses, mtu):
            _say("addressed " + line)
        bringup.confirm_applied(bringup.probe_all(loaded), addresses)
    elif new:
        _say("the fabric ports have no addresses yet: run again with --apply (or --dry-run to see the files)")
    doc = bringup.provisional(list(hosts), answers, found.topology)
    doc["ranks"] = [bringup.rank_doc(i, h, answers, facts[i].hostname, cabling.fabric_ips(addresses, i))
                    for i, h in enumerate(hosts)]
    nfs = bringup.nfs_of(facts, model_path)
    if nfs:
        doc["model"]["nfs"] = nfs
    text = bringup.render_config(doc, found.topology, datetime.date.today().isoformat())
    if dry_run:
        _say(f"--- {output}")
        click.echo(text) if not as_json else None
    else:
        output.write_text(text)
        _say(f"wrote {output}")
    result["config"] = str(output)
    ok = not found.problems
    if not dry_run and (do_ship or (do_ship is None and not yes and click.confirm(
            "put the serving image on every rank now (check fails its image row until it is there)?",
            default=True, err=True))):
        result["ship"] = _ship(output)
    if not (dry_run or no_check):
        from ..apply import preflight
        from ..inputs import config as config_mod
        from .check import print_check

        report = preflight.run(config_mod.load(output), say=_say)
        result["check"] = report.to_json()
        ok = ok and report.ok
        if not as_json:
            print_check(report, verbose=False)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif not dry_run:
        out.print("next: `sparkstack fetch ORG/NAME` if the checkpoint is not there yet, then `sparkstack check`, "
                  "then `sparkstack up`" if ok else
                  "not ready: fix what is shown above, then `sparkstack init` again or `sparkstack check`")
    sys.exit(0 if ok else 1)


def _ship(config: Path) -> str:
    """`sparkstack ship` on the config just written: "shipped", or why not (check then says it too)."""
    from ..images import build as build_mod, ship as ship_mod
    from ..gather import ranks
    from ..inputs import config as config_mod
    from ..transport import remote
    from ..errors import SparkstackError

    loaded = config_mod.load(config)
    try:
        ids = ship_mod.local_image_ids([build_mod.local_chain(loaded).top])
        with remote.Group.for_cluster(loaded.cluster, say=_say) as group:
            shipment = ranks.ship_plan(group, ids)
            ship_mod.apply(shipment, group, say=_say)
    except SparkstackError as e:
        _say(f"not shipped: {e.message}; `sparkstack build && sparkstack ship` once that is fixed")
        return "not shipped: " + e.message
    failed = [r.error or f"rank {r.rank}: failed" for r in shipment.ranks if r.status == Status.FAILED]
    for line in failed:
        _say(f"not shipped: {line}")
    return "failed" if failed else "shipped"


def _print_proposal(summary: list[str], addresses, labels) -> None:
    for line in summary:
        _say(line)
    for a in addresses:
        _say(f"  rank {a.rank} ({labels[a.rank]}) {a.netdev} {a.cidr}" + (" (already there: kept)" if a.existing else ""))


def _print_cabling(found, labels) -> None:
    if found.topology == "switch":
        for r, nd in sorted(found.switch_ports.items()):
            _say(f"switch: rank {r} ({labels[r]}) {nd}")
    for c in found.cables:
        _say(f"cable: rank {c.a.rank} ({labels[c.a.rank]}) {c.a.netdev} <-> rank {c.b.rank} "
             f"({labels[c.b.rank]}) {c.b.netdev}" + ("" if c.both_ways else " (seen from one end only)"))
    for p in found.problems:
        _say(f"PROBLEM: {p}")
    for n in found.notes:
        _say(f"note: {n}")
    _say(f"cabled as: {found.topology or 'neither a ring nor a switch'}")
