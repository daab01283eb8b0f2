"""`sparkstack profiles`: the serving profiles in env/profiles/."""

from __future__ import annotations

import json

import click

from ..inputs.profile import load_profile, profile_names
from .console import friendly_errors, out
from .shared import json_option


@click.command()
@json_option
@friendly_errors
def profiles(as_json):
    """List the serving profiles in env/profiles/ (the seeds' recipes)."""
    rows = [load_profile(name) for name in profile_names()]
    if as_json:
        click.echo(json.dumps([{"name": p.name, "engine": p.engine, "seeds": p.seeds,
                                "description": p.description} for p in rows], indent=2))
        return
    for p in rows:
        out.print(f"[bold]{p.name}[/] ({p.engine}, seeds {', '.join(p.seeds)})\n  {p.description}")
