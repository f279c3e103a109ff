"""Deployable stacks: thin, they read settings and compose constructs."""
