"""``vllm-perimeter schema``: the JSON Schema of a document the tool reads or writes."""

from __future__ import annotations

import json

import click

from scanner import documents
from scanner.output import write_text


@click.command("schema")
@click.argument("name", type=click.Choice(sorted(documents.DOCUMENTS)), required=False)
@click.option("-o", "--output", default=None, metavar="FILE", help="Write the schema to FILE.")
def command(name: str | None, output: str | None) -> None:
    """Print the JSON Schema of document NAME (without NAME: list the documents).

    \b
    The same schemas are published under schemas/ in the repository, e.g. for an editor
    validating a policy or a CI step validating a probe result:
      vllm-perimeter schema policy -o policy.schema.json
    """
    if name is None:
        for n, model in sorted(documents.DOCUMENTS.items()):
            click.echo(f"{n:18s} {(model.__doc__ or '').strip().splitlines()[0]}")
        return
    write_text(output, schema_text(name))


def schema_text(name: str) -> str:
    return json.dumps(documents.json_schema(name), indent=2, sort_keys=True) + "\n"
