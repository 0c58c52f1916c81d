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


def read_secret_file(path: Path, variable: str) -> str:
    """The secret in ``path`` (stripped); ValueError naming ``variable`` when unusable."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
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
#: the shortest secret a service accepts where a weak one is refused
MIN_SECRET_LENGTH = 16


def weak_secret(value: str, variable: str) -> str | None:
    """Why ``value`` is not a usable secret for ``variable`` (a placeholder, or shorter than
    :data:`MIN_SECRET_LENGTH`), or None when it is acceptable."""
    if value.strip().lower() in PLACEHOLDER_SECRETS:
        return f"{variable} is a placeholder; set a real secret (e.g. `openssl rand -hex 32`)"
    if len(value) < MIN_SECRET_LENGTH:
        return f"{variable} is shorter than {MIN_SECRET_LENGTH} characters"
    return None
