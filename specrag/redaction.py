"""Secrets never leave the process: option values that are keys, tokens or passwords are
replaced before a manifest or a report is written (Beam's S3 and GCS options carry them
on the command line)."""
from __future__ import annotations

SECRET_WORDS = frozenset({"key", "secret", "token", "password", "passwd", "credential", "credentials"})
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    """An option or field whose name holds key/secret/token/password/credential as a word
    (``--s3_secret_access_key``, ``--s3-access-key-id``, ``api_token``; not ``keys``)."""
    return bool(SECRET_WORDS & set(name.lower().lstrip("-").replace("-", "_").split("_")))


def redact(value):
    """``value`` with secrets replaced: string fields under secret names, and the values of
    secret options in argument lists (``--name=value`` and ``--name value``)."""
    if isinstance(value, dict):
        return {k: REDACTED if isinstance(v, str) and v and is_secret(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out, hide_next = [], False
        for item in value:
            if hide_next and isinstance(item, str) and not item.startswith("--"):
                out.append(REDACTED)
                hide_next = False
                continue
            hide_next = False
            if isinstance(item, str) and item.startswith("--") and is_secret(item.partition("=")[0]):
                flag, eq, _ = item.partition("=")
                if eq:
                    out.append(f"{flag}={REDACTED}")
                    continue
                hide_next = True
            out.append(redact(item))
        return out
    return value
