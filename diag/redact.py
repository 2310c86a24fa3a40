"""Secrets never leave the machine through pardiag's files.

Environment variables whose names say they hold a credential, command-line options
that carry one, and values that look like tokens are replaced by `REDACTED`.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping

REDACTED = "<redacted>"

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH|(^|_)KEY($|_)|(^|_)PASS($|_)|COOKIE|SESSION)",
    re.IGNORECASE,
)
# Values that are tokens whatever the variable or option is called.
_TOKEN_VALUE = re.compile(
    r"(gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|sk-[A-Za-z0-9_\-]{20,}"  # OpenAI-style
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_\-]{30,}"  # Google API key
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"  # JWT
    r"|wandb_[A-Za-z0-9]{20,}"
    r")"
)
# user:password@ in URLs (MASTER_ADDR, proxies, storage URLs)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]+):[^@/\s]+@")
# Names that look secret but are not.
_NOT_SECRET = {"SSH_AUTH_SOCK", "KEYTIMEOUT", "PYTHONHASHSEED", "XAUTHORITY"}


def is_secret_name(name: str) -> bool:
    return name.upper() not in _NOT_SECRET and bool(_SECRET_NAME.search(name))


def redact_value(value: str) -> str:
    """Token-shaped substrings and URL passwords inside any string."""
    value = _TOKEN_VALUE.sub(REDACTED, value)
    return _URL_PASSWORD.sub(lambda m: f"{m.group('scheme')}:{REDACTED}@", value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: (REDACTED if is_secret_name(k) and v else redact_value(v)) for k, v in sorted(env.items())
    }


def redact_argv(argv: Iterable[str]) -> list[str]:
    """`--api-key X`, `--token=X`, `password=X` and token-shaped values are hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-"):
            name, eq, _value = arg.lstrip("-").partition("=")
            if is_secret_name(name.replace("-", "_")):
                if eq:
                    out.append(arg.split("=", 1)[0] + "=" + REDACTED)
                else:
                    out.append(arg)
                    hide_next = True
                continue
        elif "=" in arg:
            name, _, _value = arg.partition("=")
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", name) and is_secret_name(name):
                out.append(name + "=" + REDACTED)
                continue
        out.append(redact_value(arg))
    return out


def home_paths(text: str, home: str | None = None) -> str:
    """The user's home directory written as `~` (reports are shared; where a person's
    files live is not the reader's business). PARDIAG_SHOW_PATHS=1 keeps paths."""
    import os

    if os.environ.get("PARDIAG_SHOW_PATHS") == "1":
        return text
    home = home if home is not None else os.path.expanduser("~")
    if not home or home == "/" or len(home) < 2:
        return text
    return re.sub(re.escape(home.rstrip("/")) + r"(?=/|\b|$)", "~", text)


def redact_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """Log lines: token shapes, plus the literal values of secret variables in `env`."""
    text = redact_value(text)
    if env:
        for k, v in env.items():
            if v and len(v) >= 6 and is_secret_name(k):
                text = text.replace(v, REDACTED)
    return text


REDACTION_FAILED = "<redaction failed>"

# `name=value` and `--name value` where the name says it holds a credential:
# `--api-key=XYZ`, `TOKEN=XYZ`, `--password XYZ`.
_VALUE = r"[^\s'\",;)\]}]+"
_NAMED_VALUE = re.compile(r"(?<![\w.\-])(?P<name>-{0,2}[A-Za-z_][\w\-]*)(?P<sep>=)(?P<value>" + _VALUE + ")")
_OPTION_VALUE = re.compile(r"(?<![\w.\-])(?P<name>--?[A-Za-z][\w\-]*)(?P<sep>[ \t]+)(?P<value>(?!-)" + _VALUE + ")")


def redact_message(text: str, env: Mapping[str, str] | None = None) -> str:
    """An exception message or traceback as it may be written to disk: token-shaped
    values, URL passwords, the values of `name=value` / `--name value` pairs whose name
    says secret, the literal values of secret variables in `env` (the process's own
    environment by default) and the home directory (as `~`) are hidden."""

    def named(m: re.Match[str]) -> str:
        name = m.group("name")
        if not is_secret_name(name.lstrip("-").replace("-", "_")):
            return m.group(0)
        return name + m.group("sep") + REDACTED

    text = redact_text(text, os.environ if env is None else env)
    text = _NAMED_VALUE.sub(named, text)
    text = _OPTION_VALUE.sub(named, text)
    return home_paths(text)


def safe_redact(text: Any) -> Any:
    """`redact_message` for writers that must never raise: a non-string is returned as
    is, and a failure gives REDACTION_FAILED, never the unredacted text."""
    if not isinstance(text, str):
        return text
    try:
        return redact_message(text)
    except Exception:
        return REDACTION_FAILED
