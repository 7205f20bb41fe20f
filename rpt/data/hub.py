"""Hugging Face names without waiting on the network: is the hub usable, is a name in the local cache, is it a path.

`rpt prepare --tokenizer` and `rpt label --scorer` accept Hugging Face names. Without network the hub clients retry
for up to a minute and end in a traceback, so a name is checked first and refused AT ONCE, with one line naming the
argument, when it cannot be loaded:

- a path-like name (``/x``, ``./x``, ``../x``, ``~/x``, more than one ``/``, a backslash on Windows, a file suffix
  such as ``.gguf``) that does not exist is a missing path, never a hub name (a hub id is ``owner/name``);
- any other name is fine when it is in the local Hugging Face cache, or when the hub is online.

Online or not: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE decide when set (to 1/true/yes/on: offline; to anything else:
online); otherwise one TCP connect to the hub endpoint (HF_ENDPOINT, default huggingface.co:443) with a 2 s limit,
done once per process (`probe_hub`; tests replace it).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from rpt.utils import argument_error

PROBE_TIMEOUT = 2.0
_TRUE = {"1", "true", "yes", "on"}
_PATH_SUFFIXES = (".gguf", ".json", ".safetensors", ".bin", ".pt")
_reachable: bool | None = None  # the probe's answer, once asked


def offline_env() -> bool | None:
    """True (offline) or False (online) when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set, else None."""
    values = [os.environ.get(k, "").strip().lower() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")]
    values = [v for v in values if v]
    if not values:
        return None
    return any(v in _TRUE for v in values)


def endpoint() -> tuple[str, int]:
    """(host, port) of the hub: HF_ENDPOINT, default https://huggingface.co."""
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def probe_hub(timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether a TCP connection to the hub opens within `timeout` seconds (name lookup included: it runs in a
    thread that is abandoned when late, since a broken resolver can block longer than the connect timeout)."""
    ok: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection(endpoint(), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)


def hub_online() -> bool:
    """Whether Hugging Face names may be fetched from the hub (see the module docstring)."""
    global _reachable
    env = offline_env()
    if env is not None:
        return not env
    if _reachable is None:
        _reachable = probe_hub()
    return _reachable


def why_offline() -> str:
    env = offline_env()
    if env:
        return "the hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)"
    host, port = endpoint()
    return f"the hub is unreachable (no connection to {host}:{port} within {PROBE_TIMEOUT:g} s)"


def looks_like_path(name: str) -> bool:
    """A name meant as a local path: it can never be a hub id (``owner/name``)."""
    return (name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or name.count("/") > 1
            or (os.sep != "/" and os.sep in name) or name.lower().endswith(_PATH_SUFFIXES))


def hub_cache_dir() -> Path:
    """The local hub cache: HF_HUB_CACHE as set now (huggingface_hub reads it once, at import), else the library's."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(key):
            return Path(os.environ[key]).expanduser()
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except ImportError:
        return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"


def cached_file(name: str, filename: str) -> str | None:
    """Path of `filename` of hub repo `name` in the local cache, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, filename, cache_dir=hub_cache_dir())
    except Exception:  # not a valid repo id, no huggingface_hub: not cached
        return None
    return found if isinstance(found, str) else None


def in_cache(name: str, filenames: tuple[str, ...]) -> bool:
    return any(cached_file(name, f) is not None for f in filenames)


def check_name(name: str, arg: str, accepted: str, files: tuple[str, ...]) -> bool:
    """Refuse at once a `name` that cannot be loaded: a missing path, or offline, a name not in the local cache.

    Returns whether the hub is online (callers then load cached names with ``local_files_only`` when it is not).
    Raises an ArgumentError naming argument `arg` (the CLI: its flag), what was looked for, and `accepted`.
    """
    if looks_like_path(name):
        raise argument_error(arg, name, f"no such file or folder ({Path(name).expanduser()} does not exist); "
                             f"accepted: {accepted}")
    online = hub_online()
    if not online and not in_cache(name, files):
        raise argument_error(arg, name, f"not a local path, not in the local Hugging Face cache ({hub_cache_dir()}), "
                             f"and {why_offline()}; accepted: {accepted}")
    return online
