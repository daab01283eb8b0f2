"""cluster.yaml → an Ansible inventory for `ansible/spark.yml` (INI or YAML, same content).

One group `spark`, a host per rank in rank order. Host vars say how to reach the rank exactly as
the launcher does (address, port, user, key, jump host; host keys verified against the config's
known_hosts, never trusted on first use) and what the rank is (its index, whether it serves the
NFS export, its fstab line). Group vars carry every node setting from launcher/inputs/node_settings.py,
so the role holds no second copy of them.

Ansible evaluates inventory strings as Jinja templates, and `{{ lookup('pipe', ...) }}` runs a
command on the control host. So the strings that come from the config are marked `!unsafe`
(data, never a template) in the YAML form; the INI form cannot mark them, so there a string
holding a Jinja delimiter is refused. Host names are the ranks' names, which launcher/inputs/config.py
restricts.
"""

from __future__ import annotations

import ast
import shlex

import yaml

from ..errors import SparkstackError
from ..inputs import node_settings as ns
from ..inputs.config import control_chars, split_jump

GROUP = "spark"
FORMATS = ("ini", "yaml")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"  # what the launcher reads when the config names none
PYTHON = "/usr/bin/python3"  # DGX OS and Debian both have it; naming it skips interpreter discovery

HEADER = ("# Ansible inventory for ansible/spark.yml, written by `sparkstack ansible-inventory`\n"
          "# from the cluster config. Regenerate it after editing cluster.yaml or\n"
          "# launcher/inputs/node_settings.py rather than editing it.\n")


JINJA = ("{{", "{%", "{#")


class InventoryError(SparkstackError):
    exit_code = 2


def is_sandbox(cluster) -> bool:
    """Sandbox ranks point their probe at fixture sysfs trees; real Sparks read /sys."""
    return any(rank.sysfs_root != "/" for rank in cluster.ranks)


def host_names(cluster) -> list[str]:
    names = [rank.label for rank in cluster.ranks]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise InventoryError(f"ranks[{i}] and ranks[{names.index(name)}] are both called "
                                 f"{name!r}: give each rank its own `name` (Ansible host names "
                                 f"must be unique)")
    return names


def ssh_args(cluster, rank) -> str:
    """ansible_ssh_common_args: strict host keys against the config's known_hosts file.

    A jump host goes through ProxyCommand rather than ProxyJump: ProxyJump's inner ssh would
    check the bastion against the user's default known_hosts, not the config's.
    """
    known_hosts = str(cluster.ssh.known_hosts or DEFAULT_KNOWN_HOSTS)
    strict = ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    args = list(strict)
    if rank.jump:
        user, host, port = split_jump(rank.jump)
        inner = ["ssh", *strict, "-p", port or "22"]
        if rank.key:
            inner += ["-i", str(rank.key)]
        inner += ["-W", "%h:%p", f"{user or rank.user}@{host}"]
        args += ["-o", "ProxyCommand=" + shlex.join(inner)]
    return shlex.join(args)


class _Unsafe(str):
    """A string from the config: Ansible must take it as data, never as a template (YAML's
    `!unsafe`; in INI, refused if it looks like one)."""


def _unsafe(value):
    if isinstance(value, str):
        return _Unsafe(value)
    if isinstance(value, dict):  # keys: ours, or sysctl names (node_settings checks them)
        return {k: _unsafe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unsafe(v) for v in value]
    return value


def host_vars(cluster, index: int) -> dict:
    rank = cluster.ranks[index]
    hv = {"ansible_host": rank.address, "ansible_port": rank.port, "ansible_user": rank.user}
    if rank.key:
        hv["ansible_ssh_private_key_file"] = str(rank.key)
    hv["ansible_ssh_common_args"] = ssh_args(cluster, rank)
    hv["spark_rank"] = index
    hv["spark_nfs_server"] = index == ns.nfs_server_index(cluster)
    hv["spark_node_drop_caches_user"] = rank.user
    ns.sudoers_rule(rank.user)  # refuses a user name that cannot go into sudoers, now
    entry = ns.fstab_entry(cluster, index)
    if entry:
        hv["spark_node_fstab_entry"] = entry
    return _unsafe(hv)  # every host var comes from the config


def group_vars(cluster, no_swap: bool = False) -> dict:
    """`no_swap`: the profile's or config's (config.no_swap), which the cluster alone lacks."""
    sandbox = is_sandbox(cluster)
    return {
        "ansible_python_interpreter": PYTHON,
        "spark_node_sysctl_file": ns.SYSCTL_FILE,
        "spark_node_sysctls": _unsafe(ns.sysctls(cluster)),
        "spark_node_limits_file": ns.LIMITS_FILE,
        "spark_node_limits": ns.limits(),
        "spark_node_docker_daemon_json": ns.DOCKER_DAEMON_JSON,
        "spark_node_docker_default_ulimits": ns.docker_default_ulimits(),
        "spark_node_sudoers_file": ns.SUDOERS_FILE,
        "spark_node_sudo_commands": list(ns.SUDO_COMMANDS),
        "spark_node_model_path": _unsafe(cluster.model.path),
        "spark_node_earlyoom_defaults_file": ns.EARLYOOM_DEFAULTS_FILE,
        "spark_node_earlyoom_args": ns.EARLYOOM_ARGS,
        "spark_node_header": ns.HEADER,
        "spark_node_no_swap": no_swap,
        "spark_node_swap_line_regexp": ns.SWAP_LINE_RE,
        "spark_node_swap_mark": ns.SWAP_FSTAB_MARK,
        # gpu_clock: the oneshot unit's command ("" : no lock, the unit is removed)
        "spark_node_gpu_clock_unit": ns.GPU_CLOCK_UNIT,
        "spark_node_gpu_clock_command": (ns.gpu_clock_command(*ns.gpu_clock_range(cluster))
                                         if cluster.gpu_clock else ""),
        # Sandbox ranks share this machine's kernel: a live sysctl would change the host (the
        # sandbox shadows only /proc/sys/vm), the kernel has no NFS (the checkpoint is already
        # a bind mount there), and other tests share each rank's dockerd, which a handler would
        # restart; its ranks have no package mirror either. So the sandbox gets the files only.
        "spark_node_apply_live": not sandbox,
        "spark_node_mount_now": not sandbox,
        "spark_node_manage_services": not sandbox,
        "spark_node_install_packages": not sandbox,
        # the sandbox's /proc/swaps is the host's: never swapoff there
        "spark_node_swapoff_now": not sandbox,
    }


def build(cluster, no_swap: bool = False) -> dict:
    """The inventory as the YAML inventory plugin reads it."""
    hosts = {name: host_vars(cluster, i) for i, name in enumerate(host_names(cluster))}
    variables = group_vars(cluster, no_swap)
    for name, hv in hosts.items():
        _refuse_control(f"host {name}", hv)
    _refuse_control(f"group {GROUP}", variables)
    return {"all": {"children": {GROUP: {"hosts": hosts, "vars": variables}}}}


def _refuse_control(where: str, variables: dict) -> None:
    """A string from the config with a line separator or control character: Ansible's INI parser
    splits lines with str.splitlines() (\r, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029 too), so
    such a value would become inventory lines of its own (`ansible_ssh_extra_args=-o
    ProxyCommand=...` runs a command here). The config refuses them (launcher/inputs/config.py);
    this refuses them for any cluster that got past it, in both formats."""
    for name, value in variables.items():
        for text in _strings(value):
            bad = isinstance(text, _Unsafe) and control_chars(text)
            if bad:
                raise InventoryError(f"{where}: {name} = {text!r} holds a line break or control "
                                     f"character ({', '.join(map(repr, bad))}), which would start "
                                     "a line of its own in the inventory: remove it from the config")


def render(cluster, fmt: str = "ini", no_swap: bool = False) -> str:
    if fmt not in FORMATS:
        raise InventoryError(f"unknown inventory format {fmt!r}: use one of {', '.join(FORMATS)}")
    return render_yaml(cluster, no_swap) if fmt == "yaml" else render_ini(cluster, no_swap)


def render_yaml(cluster, no_swap: bool = False) -> str:
    return HEADER + yaml.dump(build(cluster, no_swap), Dumper=_Dumper, sort_keys=False, width=1000)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the files' header) as `|` blocks, which read like the file."""


def _represent(tag: str):
    return lambda dumper, s: dumper.represent_scalar(tag, s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _represent("tag:yaml.org,2002:str"))
_Dumper.add_representer(_Unsafe, _represent("!unsafe"))


def _strings(value):
    """Every string in a variable's value, dict keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _refuse_templates(where: str, variables: dict) -> None:
    for name, value in variables.items():
        for text in _strings(value):
            if any(mark in text for mark in JINJA):
                raise InventoryError(f"{where}: {name} = {text!r} holds Jinja syntax ({', '.join(JINJA)}), "
                                     "which Ansible would evaluate on the control host and an INI "
                                     "inventory cannot mark as data: remove it from the config, "
                                     "or use --format yaml (its values are marked !unsafe)")


def render_ini(cluster, no_swap: bool = False) -> str:
    group = build(cluster, no_swap)["all"]["children"][GROUP]
    for name, hv in group["hosts"].items():
        _refuse_templates(f"host {name}", hv)
    _refuse_templates(f"group {GROUP}", group["vars"])
    lines = [f"[{GROUP}]"]
    for name, hv in group["hosts"].items():
        lines.append(" ".join([name] + [f"{k}={shlex.quote(_ini_value(v))}" for k, v in hv.items()]))
    lines += ["", f"[{GROUP}:vars]"]
    lines += [f"{k}={_ini_value(v)}" for k, v in group["vars"].items()]
    return HEADER + "\n".join(lines) + "\n"


def _ini_value(value) -> str:
    """A value Ansible's INI parser reads back as the same object: it tries
    ast.literal_eval on every value and keeps the raw text when that fails."""
    if isinstance(value, str):
        if "\n" in value or _literal_changes(value):
            return repr(value)  # a Python string literal: read back as this exact string
        return value
    if isinstance(value, (bool, int, dict, list)):
        return repr(value)  # Python literals (True, {'a': 1}), which literal_eval reads back
    raise TypeError(f"no INI form for {type(value).__name__}")


def _literal_changes(text: str) -> bool:
    try:
        return ast.literal_eval(text) != text
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def with_host_vars(cluster, extra: dict[int, dict]) -> str:
    """A YAML inventory of the ranks with more host vars per rank index (for ansible/fabric.yml:
    each rank's netplan text and addresses), every value data, never a template."""
    hosts = {}
    for i, name in enumerate(host_names(cluster)):
        _refuse_control(f"host {name}", host_vars(cluster, i))  # the extras: ours (netplan text)
        hosts[name] = {**host_vars(cluster, i), **_unsafe(extra.get(i, {}))}
    doc = {"all": {"children": {GROUP: {"hosts": hosts, "vars": {"ansible_python_interpreter": PYTHON}}}}}
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)
