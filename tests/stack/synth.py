"""Synthesize the project's stacks in-process the way `cdk synth` does (cdk.json flags)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aws_cdk as cdk
from aws_cdk.assertions import Template

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")


def cdk_json_context() -> dict:
    """Tests that build App() directly do not see cdk.json's feature flags unless given them."""
    return json.loads((REPO / "cdk.json").read_text())["context"]


def new_app(outdir: str | None = None, **context: object) -> cdk.App:
    return cdk.App(context={**cdk_json_context(), **context}, outdir=outdir)


#: Templates already synthesized in this test process, by their context (a synth takes
#: seconds; about twenty modules ask for the default one). A Template is read-only: its
#: ``to_json()`` returns a new dict every call, so sharing one between tests is safe.
_TEMPLATES: dict[tuple[tuple[str, str], ...], Template] = {}


def cluster_template(**context: object) -> Template:
    """Template of DLClusterStack built by app.py's own code path, with cdk-nag enabled
    (synthesized once per context in a test process)."""
    key = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in context.items()))
    if key not in _TEMPLATES:
        import app as app_module

        app = app_module.build_app(new_app(**context))
        stack = app.node.find_child("DLClusterStack")
        _TEMPLATES[key] = Template.from_stack(stack)  # type: ignore[arg-type]
    return _TEMPLATES[key]
