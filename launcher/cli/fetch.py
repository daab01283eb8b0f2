"""`sparkstack fetch`: the checkpoint downloaded once from the Hub, checked against the Hub's digests."""

from __future__ import annotations

import json

import click

from ..errors import SparkstackError
from .console import err, out
from .shared import json_option, show_or_refuse, with_cluster


@click.command()
@with_cluster(interrupted="interrupted: the files fetched so far are in place and each one in flight is kept "
                          "as .NAME.partial; re-run `sparkstack fetch` to resume: only the rest moves")
@click.argument("repo", metavar="ORG/NAME")
@click.option("--revision", default="main", show_default=True, metavar="REV",
              help="a branch, a tag or a commit; it is resolved to its commit once and every file is fetched at it")
@click.option("--to", "to", metavar="DIR",
              help="download here instead (default: the NFS export's directory when this host is model.nfs's "
                   "server, else model.path when this host is rank 0)")
@click.option("--include", multiple=True, metavar="GLOB", help="only the files matching (repeatable; default all)")
@click.option("--workers", type=click.IntRange(1, 32), default=4, show_default=True, help="files downloaded at once")
@click.option("--verify-all", is_flag=True,
              help="hash every file already there again (default: a file checked by an earlier fetch, at "
                   "the same size and mtime, is not)")
@click.option("--dry-run", is_flag=True, help="list the files, what is there and the free space; download nothing")
@json_option
def fetch(loaded, repo, revision, to, include, workers, verify_all, dry_run, as_json):
    """Download a Hub repository (the checkpoint) once, to where the ranks read it, and check
    every file against the Hub's own digests.

    \b
    The first bring-up: `init` → `fetch` → `check` → `up`:
      sparkstack fetch drowzeys/keys-GLM-5.3-EXL3-2.75BPW

    Where: the NFS export's directory (model.nfs.export) when this host is its server, else
    model.path when this host is rank 0 (no NFS: rank 0's own disk); --to names another. The
    repository is listed once at REV's commit: each file's size and, for an LFS file, the
    publisher's sha256. Nothing is downloaded when the free space there is short of the bytes to
    move plus 1 GB: the message says how much to free.

    \b
    Each file goes to .NAME.partial first; it is hashed on the way in and kept under its name
    only when it is the publisher's (the LFS sha256, else the git blob id). A file that differs
    is named and fetched again (twice, then the fetch fails naming it). Ctrl+C or a lost
    connection: the next run asks for the rest of each partial file only. Progress on stderr:
    bytes, rate, ETA. Then the Hub's digests become the manifest `check --deep` compares every
    rank with (the publisher's, not this copy's), with the repository, revision and commit.

    \b
    The token is huggingface_hub's: HF_TOKEN, else the HF token file (`hf auth login`); it is
    never a flag and never printed. A gated repository without one (or with an account that has
    not accepted its terms) ends with the page to accept and the token to set (exit 2).
    HF_ENDPOINT points the client at a mirror (the sandbox's stand-in Hub in tests).

    --json prints {"plan": {"repo", "revision", "commit", "gated", "dest", "dest_why", "free",
    "total", "to_move", "need", "files": [{"name", "size", "state", "have"}], "refusals"},
    "result": {"commit", "moved", "seconds", "rate", "fetched", "refetched", "hashed",
    "manifest", "error"}} (no "result" with --dry-run).
    """
    from ..apply import fetch as fetch_mod
    from ..gather import here
    from ..plan import fetching

    model = loaded.cluster.model
    try:
        dest, why = fetching.destination(model.path, model.nfs.server if model.nfs else None,
                                         model.nfs.export if model.nfs else None, to, here.addresses(),
                                         loaded.cluster.ranks[0].address)
    except ValueError as e:
        raise SparkstackError(str(e)) from None
    listing = fetch_mod.list_repo(repo, revision)
    if listing.gated and not fetch_mod.has_token():
        raise fetch_mod.GatedError(fetch_mod.gated_message(repo, fetch_mod.endpoint(), False))
    listing = fetching.Listing(listing.repo, listing.revision, listing.commit, listing.gated,
                               fetching.select(listing.files, include))
    if not listing.files:
        raise SparkstackError(f"{repo} at {revision}: no file matches {' '.join(include)}")
    plan = fetching.make_plan(listing, dest, fetch_mod.have(dest, listing, verify_all),
                              fetch_mod.free_bytes(dest), why)
    if show_or_refuse(plan, fetching.lines, as_json, dry_run):
        return
    say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731
    say(f"fetch: {repo} at {revision} (commit {listing.commit}) to {dest}: {fetching.gb(plan.to_move)} to move "
        f"of {fetching.gb(listing.total)}")
    result = fetch_mod.apply(plan, say, workers=workers,
                             model_dir=model.path if dest.rstrip("/") != model.path.rstrip("/") else dest)
    if as_json:
        click.echo(json.dumps({"plan": plan.to_json(), "result": result.to_json()}, indent=2))
    if result.error:
        failed = SparkstackError(result.error)
        failed.exit_code = result.exit_code or 1
        raise failed
    if not as_json:
        rate = f", {result.moved / 1e6 / result.seconds:,.1f} MB/s" if result.moved and result.seconds else ""
        out.print(f"{repo} at commit {listing.commit}: {len(listing.files)} files in {dest}, each the Hub's "
                  f"({fetching.gb(result.moved)} moved in {result.seconds:.1f} s{rate}"
                  + (f"; fetched again: {', '.join(result.refetched)}" if result.refetched else "") + ")",
                  markup=False, highlight=False)
        if result.manifest:
            out.print(f"manifest (the Hub's digests, for `check --deep`): {result.manifest}", markup=False)
        else:
            out.print("no *.safetensors among them: no manifest written", markup=False)
