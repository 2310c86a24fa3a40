"""Errors a user can fix: one line on stderr, exit code 2, no traceback (unless --debug)."""

from __future__ import annotations


class UserError(Exception):
    """Bad arguments, missing or unreadable input, a run directory that cannot be used."""

    exit_code = 2
