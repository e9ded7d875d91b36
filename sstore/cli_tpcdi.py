"""``sstore tpcdi ...``: the TPC-DI DimTrade workload from the command line.

A thin group: each subcommand lives beside the code it drives (the generator, the audit) and
is only attached here.
"""

from __future__ import annotations

import click

from sstore.workloads.tpcdi.audit_cli import audit_command
from sstore.workloads.tpcdi.generator.cli import generate_command

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
def tpcdi() -> None:
    """TPC-DI DimTrade: generate source data, load the warehouse, audit it.

    \b
    Try it:
      sstore tpcdi generate --scale-factor 0.1 --output /tmp/tpcdi
      sstore tpcdi audit --postgres postgresql://postgres@127.0.0.1/postgres
    """


tpcdi.add_command(generate_command, name="generate")
tpcdi.add_command(audit_command, name="audit")
