"""Secrets read from files: the ``<VARIABLE>_FILE`` convention of container images.

A settings class declares, next to a secret field ``x``, a field ``x_file`` (so
``FEDREC_AGG_OPERATOR_TOKEN_FILE`` sits next to ``FEDREC_AGG_OPERATOR_TOKEN``); when the file
field is set, the secret is the file's content without surrounding white space. Compose mounts
such files from a volume (deploy/init_secrets.py writes them), Kubernetes from a Secret.
Setting both the value and its file is refused, as is an unreadable or empty file.
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings

#: the largest secret file read (a secret is a line; a bigger file, or an endless one such as
#: /dev/zero, is a wrong path, and reading it whole could exhaust memory)
MAX_SECRET_FILE_BYTES = 64 * 1024


def read_secret_file(path: Path, variable: str) -> str:
    """The secret in ``path`` (stripped); ValueError naming ``variable`` when unusable."""
    try:
        with Path(path).open("rb") as fh:
            raw = fh.read(MAX_SECRET_FILE_BYTES + 1)
        if len(raw) > MAX_SECRET_FILE_BYTES:
            raise ValueError(
                f"{variable}: {path} is larger than {MAX_SECRET_FILE_BYTES} bytes; not a secret"
            )
        value = raw.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ValueError(f"{variable}: cannot read {path}: {reason}") from None
    if not value:
        raise ValueError(f"{variable}: {path} is empty")
    return value


def secret_from_file(settings: BaseSettings, field: str) -> str | None:
    """The value of ``field`` read from the file named by ``<field>_file``, or None when that
    file field is unset. ValueError when both are set or the file is unusable."""
    path = getattr(settings, f"{field}_file")
    if path is None:
        return None
    prefix = str(settings.model_config.get("env_prefix", ""))
    variable = f"{prefix}{field}_file".upper()
    if field in settings.model_fields_set:
        raise ValueError(f"set {prefix}{field.upper()} or {variable}, not both")
    return read_secret_file(path, variable)


#: values that stand for "put a real secret here" in examples and manifests (compared lowercase)
PLACEHOLDER_SECRETS = frozenset(
    {"changethis", "replace_me", "replace-me", "changeme", "change_me", "secret", "password"}
)
#: placeholders also refused inside a longer value (``changethis-changethis``)
_PLACEHOLDER_WORDS = (
    "changethis",
    "changeme",
    "change_me",
    "replace_me",
    "replace-me",
    "replaceme",
)
#: the shortest secret a service accepts where a weak one is refused
MIN_SECRET_LENGTH = 16
#: the fewest distinct characters of an accepted secret (``aaaa...``, ``abab...`` are refused)
MIN_DISTINCT_CHARACTERS = 8


def weak_secret(value: str, variable: str) -> str | None:
    """Why ``value`` is not a usable secret for ``variable`` (a placeholder, shorter than
    :data:`MIN_SECRET_LENGTH`, or of low entropy: fewer than :data:`MIN_DISTINCT_CHARACTERS`
    distinct characters), or None when it is acceptable."""
    lowered = value.strip().lower()
    if lowered in PLACEHOLDER_SECRETS or any(w in lowered for w in _PLACEHOLDER_WORDS):
        return f"{variable} is a placeholder; set a real secret (e.g. `openssl rand -hex 32`)"
    if len(value) < MIN_SECRET_LENGTH:
        return f"{variable} is shorter than {MIN_SECRET_LENGTH} characters"
    if len(set(value)) < MIN_DISTINCT_CHARACTERS:
        return (
            f"{variable} has low entropy (fewer than {MIN_DISTINCT_CHARACTERS} distinct "
            "characters); use a random secret (e.g. `openssl rand -hex 32`)"
        )
    return None
