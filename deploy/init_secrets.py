"""One-shot: make sure every secret of the compose deployment exists as a file.

Run by the ``secrets`` service of docker-compose.yml before anything else starts. For each
secret it writes ``<SECRETS_DIR>/<name>`` (mode 0600):

* the value of its environment variable when one is given (a ``.env`` file or the shell:
  real secrets for production), refused when it is a known placeholder or too short;
* else the file as it already is (a second ``docker compose up`` keeps the first secrets);
* else a fresh random one (``secrets.token_urlsafe``): the zero-configuration demo.

From the enrolment secret it then derives each worker shard's enrolment token
(``enrolment_token_<shard>`` for ``WORKER_SHARDS`` shards, default 2; services/enrolment.py),
which the worker of that shard registers its users with.

The services read them through their ``*_FILE`` settings (``FEDREC_AGG_OPERATOR_TOKEN_FILE``,
...), the convention of the official images. PostgreSQL only uses its password when it
initialises an empty data volume: changing ``POSTGRES_PASSWORD`` later needs ``ALTER USER`` or
a fresh volume (``docker compose down -v``). Exit status 0 on success, 1 with a message
otherwise; no secret is ever printed.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

# file name -> environment variable that may provide it
from services.enrolment import enrolment_token
from services.secret_files import weak_secret

SECRETS = {
    "postgres_password": "POSTGRES_PASSWORD",
    "operator_token": "FEDREC_AGG_OPERATOR_TOKEN",
    "reader_token": "FEDREC_AGG_READER_TOKEN",
    "enrolment_secret": "FEDREC_AGG_ENROLMENT_SECRET",
    # the workers' device API (the demo's recommendations through a worker) asks for it
    "device_token": "FEDREC_WORKER_DEVICE_TOKEN",
}
DEFAULT_DIR = "/run/fedrec-secrets"


def check_given(name: str, value: str) -> str | None:
    """Why a value given by the environment is refused, or None when it is acceptable (the
    services' own rules: services/secret_files.py)."""
    why = weak_secret(value, name)
    if why is None and name == "POSTGRES_PASSWORD" and any(c in value for c in "@:/?#%"):
        return f"{name} goes into a database URL: use URL-safe characters (letters, digits, -_)"
    return why


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` atomically, readable by its owner only."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    os.replace(tmp, path)


def ensure_secrets(directory: Path, env: dict[str, str], shards: int = 2) -> list[str]:
    """Create or update every secret file and the shards' enrolment tokens; returns one line per
    secret saying where it came from. Raises ValueError (with every problem) when a given value
    is refused."""
    problems = [
        why
        for var in SECRETS.values()
        if env.get(var) and (why := check_given(var, env[var])) is not None
    ]
    if problems:
        raise ValueError("; ".join(problems))
    report = []
    for name, var in SECRETS.items():
        path = directory / name
        given = env.get(var, "")
        if given:
            if not path.exists() or path.read_text().strip() != given:
                write_secret(path, given)
            report.append(f"{name}: from {var}")
        elif path.exists() and path.read_text().strip():
            report.append(f"{name}: kept")
        else:
            write_secret(path, secrets.token_urlsafe(32))
            report.append(f"{name}: generated")
    secret = (directory / "enrolment_secret").read_text().strip()
    for shard in range(shards):
        write_secret(directory / f"enrolment_token_{shard}", enrolment_token(secret, shard, shards))
    report.append(f"enrolment tokens of {shards} shards: derived")
    return report


def main() -> int:
    """Ensure the secrets in ``$SECRETS_DIR`` (default /run/fedrec-secrets)."""
    directory = Path(os.environ.get("SECRETS_DIR", DEFAULT_DIR))
    shards = os.environ.get("WORKER_SHARDS", "2")
    if not shards.isdigit() or int(shards) < 1:
        sys.stderr.write(f"WORKER_SHARDS must be a positive integer, got {shards!r}\n")
        return 1
    try:
        directory.mkdir(parents=True, exist_ok=True)
        report = ensure_secrets(directory, dict(os.environ), int(shards))
    except ValueError as err:
        sys.stderr.write(f"refusing the given secrets: {err}\n")
        return 1
    except OSError as err:
        sys.stderr.write(f"cannot write secrets in {directory}: {err}\n")
        return 1
    print(f"secrets in {directory}: " + ", ".join(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
