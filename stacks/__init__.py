"""Deployable stacks: thin, they read settings and compose constructs."""

import os

# jsii relays Node's warnings to Python's stderr as raw bytes (b'!!  Node 20 is end-of-life…'),
# on every run; the README says which Node to use, so the stacks do not repeat it as noise.
for _name, _value in (("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20"),
                      ("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1"),
                      ("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")):
    os.environ.setdefault(_name, _value)
