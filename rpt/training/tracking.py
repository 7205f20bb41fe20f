"""Weights & Biases beside log.jsonl and TensorBoard (train.wandb, train.wandb_project), on the main rank.

The run logs the scalars of each log.jsonl row, with the row's "step" as the x axis. Where it logs:

- offline (a folder under ``<out_dir>/wandb``, or under $WANDB_DIR; upload it later with ``wandb sync``) when
  WANDB_MODE=offline (or dryrun), or when no W&B login is found (WANDB_API_KEY, or a netrc entry for the W&B host);
- online otherwise. When W&B cannot be reached there, the run falls back to offline with a warning: an unreachable
  W&B never stops or holds up training (its start waits at most INIT_TIMEOUT seconds);
- nowhere with WANDB_MODE=disabled.

A resumed run continues the same W&B run: its id is kept in ``<out_dir>/wandb.json``. The wandb package is optional
(``pip install 'rpt[wandb]'``); `require_wandb` refuses a run that asks for it without it, before training starts.
"""

from __future__ import annotations

import json
import netrc
import os
import uuid
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rpt.config import RPTConfig
from rpt.utils import RPTWarning, UserError, error_line

INSTALL = "pip install 'rpt[wandb]'"
INIT_TIMEOUT = 20.0  # seconds wandb.init may take online before the run goes on offline
ID_FILE = "wandb.json"


def require_wandb() -> Any:
    """The wandb module, or a one-line UserError saying how to install it."""
    try:
        import wandb
    except ImportError:
        raise UserError(f"train.wandb needs the wandb package, which is not installed: {INSTALL} (or turn "
                        "train.wandb off)") from None
    return wandb


def logged_in() -> bool:
    """Whether W&B credentials are here: WANDB_API_KEY, or a netrc entry for the W&B host (what `wandb login`
    writes). Nothing is sent anywhere."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        entry = netrc.netrc(os.environ.get("NETRC")).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def wandb_mode() -> str:
    """"online", "offline" or "disabled": WANDB_MODE when it says offline/dryrun or disabled, online only with a
    login (WANDB_MODE=online without one is offline too, rather than a prompt that would hold up the run)."""
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env in ("offline", "dryrun"):
        return "offline"
    if env == "disabled":
        return "disabled"
    if not logged_in():
        if env == "online":
            warnings.warn("WANDB_MODE=online but no W&B login was found (WANDB_API_KEY or `wandb login`): logging "
                          "offline", RPTWarning, stacklevel=3)
        return "offline"
    return "online"


class WandbLog:
    """One W&B run for a training run: `log(row)` per log.jsonl row, `close()` at the end. A failure of W&B while
    logging is a warning, after which the run goes on without it (log.jsonl is the record)."""

    def __init__(self, out_dir: Path, cfg: RPTConfig, project: str) -> None:
        wandb = require_wandb()
        id_file = out_dir / ID_FILE
        try:
            run_id = str(json.loads(id_file.read_text())["id"])
        except (OSError, ValueError, KeyError, TypeError):
            run_id = uuid.uuid4().hex[:8]
        mode = wandb_mode()
        self.mode = mode
        kwargs = {"project": project, "id": run_id, "resume": "allow", "name": out_dir.name,
                  "dir": os.environ.get("WANDB_DIR") or str(out_dir), "config": cfg.to_dict()}
        settings = {"init_timeout": INIT_TIMEOUT, "console": "off", "silent": True}
        self.run = None
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(**settings), **kwargs)
        except Exception as e:  # unreachable, refused, timed out: wandb raises several types
            if mode != "online":
                self._give_up(e)
                return
            warnings.warn(f"W&B could not be reached ({error_line(e)}): logging offline under {kwargs['dir']}/wandb "
                          "(upload it later with `wandb sync`)", RPTWarning, stacklevel=2)
            self.mode = "offline"
            try:
                self.run = wandb.init(mode="offline", settings=wandb.Settings(**settings), **kwargs)
            except Exception as e2:
                self._give_up(e2)
                return
        id_file.write_text(json.dumps({"id": run_id, "project": project}) + "\n")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def _give_up(self, e: BaseException) -> None:
        warnings.warn(f"W&B logging is off for this run ({error_line(e)}); log.jsonl has every row", RPTWarning,
                      stacklevel=3)
        self.run = None

    def log(self, row: dict[str, Any]) -> None:
        if self.run is None:
            return
        try:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        except Exception as e:
            self._give_up(e)

    def close(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as e:
            warnings.warn(f"W&B run did not finish cleanly ({error_line(e)})", RPTWarning, stacklevel=2)
        self.run = None
