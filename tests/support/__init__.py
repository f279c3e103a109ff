"""Helpers shared by several test packages (never import another test module)."""
