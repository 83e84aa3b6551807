"""Where a worker keeps its local files: the state directory, never the working directory.

The Faust runtime needs a writable data directory (Faust creates
``<datadir>/v1/tables`` at start, even with the in-memory store); the demo keeps
its worker's log and state in a temporary one. A deployed worker often runs with
a read-only working directory (a container as uid 65534 in ``/``, a systemd
``DynamicUser``), so nothing is ever written relative to the working directory.

The state directory is the ``state_dir`` setting (``--set state_dir=...`` or
``GRUDGE_STATE_DIR``); by default the first that applies of:

1. ``$XDG_STATE_HOME/grudge-stream`` when ``XDG_STATE_HOME`` is set (an absolute path);
2. ``~/.local/state/grudge-stream`` for a user whose home directory exists and is writable;
3. ``/var/lib/grudge-stream`` when it (or ``/var/lib``, to create it) is writable;

else the worker stops with a one-line ``ConfigError`` (exit status 2) that says to
set ``GRUDGE_STATE_DIR``. A worker's files go to ``<state_dir>/<app_id>``.

The Faust runtime's local files are rebuilt from Kafka on every start, so it does
not stop there: with no ``state_dir`` set and none of the above writable (an
unprivileged container with no home), it takes a private temporary directory
(mode 0700, under ``TMPDIR`` or ``/tmp``) and says so in one INFO line.
"""
from __future__ import annotations

import logging
import os
import pwd
import tempfile
from pathlib import Path
from typing import Mapping

from grudge_stream.exceptions import ConfigError

log = logging.getLogger(__name__)

APP_NAME = "grudge-stream"
_TEMP_DIRS: dict[str, Path] = {}  # app id -> the private temporary directory taken for it
SYSTEM_STATE_DIR = Path("/var/lib") / APP_NAME


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _home(environ: Mapping[str, str]) -> str | None:
    home = environ.get("HOME")
    if home:
        return home
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # a uid without a passwd entry (a container's arbitrary uid)
        return None


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The state directory when ``state_dir`` is not set (see the module docstring)."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative path is invalid and ignored
        return Path(xdg) / APP_NAME
    home = _home(environ)
    if home and os.path.isabs(home) and _writable_dir(Path(home)):
        return Path(home) / ".local" / "state" / APP_NAME
    if _writable_dir(SYSTEM_STATE_DIR) or (not SYSTEM_STATE_DIR.exists()
                                           and _writable_dir(SYSTEM_STATE_DIR.parent)):
        return SYSTEM_STATE_DIR
    raise ConfigError(
        f"no writable state directory for uid {os.getuid()} (home {home or 'unknown'!s} is not writable, "
        f"nor is {SYSTEM_STATE_DIR}): set GRUDGE_STATE_DIR (or --set state_dir=PATH) to a directory "
        "this user may write")


def state_dir(settings) -> Path:
    """The ``state_dir`` setting, made absolute, else the default."""
    given = settings.get("state_dir", None)
    if given:
        return Path(os.path.abspath(os.path.expanduser(str(given))))
    return default_state_dir(getattr(settings, "environ", None))


def app_state_dir(settings, app_id: str, temporary_fallback: bool = False) -> Path:
    """``<state_dir>/<app_id>``, created if missing and checked writable; a ``ConfigError``
    (one line, exit status 2 from the CLI) when it cannot be.

    ``temporary_fallback`` (the Faust runtime, whose local files are rebuilt from Kafka):
    with no ``state_dir`` setting and no writable default, a private temporary directory,
    the same one for every call of this process."""
    try:
        base = state_dir(settings)
    except ConfigError as exc:
        if not temporary_fallback:
            raise
        name = app_id.replace(os.sep, "_")
        if name not in _TEMP_DIRS:
            try:
                _TEMP_DIRS[name] = Path(tempfile.mkdtemp(prefix=f"{APP_NAME}-{name}-"))
            except OSError:
                raise exc from None
            log.info("no writable state directory for uid %d: using the private temporary directory %s "
                     "(Faust's local files, rebuilt from Kafka on every start; set GRUDGE_STATE_DIR to keep "
                     "them elsewhere)", os.getuid(), _TEMP_DIRS[name])
        return _TEMP_DIRS[name]
    path = base / app_id.replace(os.sep, "_")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"state directory {path} cannot be created ({exc.strerror or exc}): set GRUDGE_STATE_DIR "
            f"(or --set state_dir=PATH) to a directory uid {os.getuid()} may write") from None
    if not _writable_dir(path):
        raise ConfigError(
            f"state directory {path} is not writable by uid {os.getuid()}: set GRUDGE_STATE_DIR "
            "(or --set state_dir=PATH) to a directory this user may write")
    return path
