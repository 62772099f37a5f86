"""`python -m nanobot` runs the CLI."""

from nanobot.cli import main

main()
