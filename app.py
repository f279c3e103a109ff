#!/usr/bin/env python3
"""CDK app: DLClusterStack, configured from CDK context (docs/settings.md).

Only this file reads context and the environment; stacks and constructs take typed settings.
"""

from __future__ import annotations

import os
import sys

# jsii relays Node's warnings to Python's stderr as raw bytes (b'!!  Node 20 is end-of-life…'),
# on every run; the README says which Node to use, so the app does not repeat it as noise.
for _name, _value in (("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20"),
                      ("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1"),
                      ("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")):
    os.environ.setdefault(_name, _value)

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from constructs_lib.validation import ConfigError
from stacks.cluster_stack import DLClusterStack
from stacks.context import refuse_unknown_keys
from stacks.emr_stack import EMR_CONTEXT_KEYS, DLEmrClusterStack, emr_settings_from_context
from stacks.settings import CONTEXT_KEYS, settings_from_context


def build_app(app: cdk.App | None = None) -> cdk.App:
    app = app or cdk.App()
    # A misspelt key (workercount) would otherwise be ignored and deploy the default.
    refuse_unknown_keys(app.node.get_all_context(), {*CONTEXT_KEYS, *EMR_CONTEXT_KEYS})
    settings = settings_from_context(app.node.try_get_context)
    # Env-agnostic unless the user pins an account/region: synth then needs no AWS access.
    account, region = os.environ.get("CDK_DEPLOY_ACCOUNT"), os.environ.get("CDK_DEPLOY_REGION")
    env = cdk.Environment(account=account, region=region) if account and region else None
    DLClusterStack(
        app,
        "DLClusterStack",
        settings=settings,
        env=env,
        description="Distributed deep-learning cluster (dl-cluster-cdk)",
    )
    DLEmrClusterStack(
        app,
        "DLEmrClusterStack",
        env=env,
        settings=emr_settings_from_context(app.node.try_get_context),
        description="EMR deep-learning cluster on the Deep Learning AMI (dl-cluster-cdk)",
    )
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


def main() -> None:
    try:
        app = build_app()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    app.synth()


if __name__ == "__main__":
    main()
