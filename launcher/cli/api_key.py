"""`sparkstack api-key`: the key rank 0's API asks for."""

from __future__ import annotations

import json

import click

from .shared import json_option, with_cluster


@click.command("api-key")
@with_cluster()
@json_option
def api_key(loaded, as_json):
    """Print the key rank 0's API asks for (generated the first time).

    
    Clients send it as a bearer token, e.g.
      curl -H "Authorization: Bearer $(sparkstack api-key)" http://RANK0:PORT/v1/models
      OPENAI_BASE_URL=http://RANK0:PORT/v1 OPENAI_API_KEY=$(sparkstack api-key) your-client
    It is cluster.yaml's overrides.api_key when given; else a key generated once (by this or by
    `up`) and kept, mode 0600, in $XDG_STATE_HOME/sparkstack/api-keys/<rank 0's address>
    (default ~/.local/state/...). Delete that file and run `up` to change it.
    An API without a key (overrides.open_api: true, a TensorFold profile) is an error here
    (exit 2). --json prints {"key", "source", "file", "warning", "url"}, "key" null when none.
    """
    from ..transport import api
    from ..inputs import apikey

    key = apikey.resolve(loaded, create=True)
    url = api.endpoint(loaded).url + "/v1"
    if as_json:
        click.echo(json.dumps({**key.to_json(reveal=True), "url": url}, indent=2))
        return
    if key.value is None:
        raise apikey.ApiKeyError(f"{loaded.path}: the API at {url} takes no key: {key.warning}")
    click.echo(key.value)
