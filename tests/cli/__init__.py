"""Tests of dlc, the laptop CLI (dlc/), and of the emulator's SSM agent it talks through."""
