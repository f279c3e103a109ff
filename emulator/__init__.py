"""Local stand-ins for the AWS pieces moto does not provide (test/emulator support only).

Not shipped to nodes: product code must never import from here.
"""
