"""``Trainable``: the class API of a trial (``setup``, ``step``, ``save_checkpoint``...).

Subclass it and implement :meth:`Trainable.setup` (read the config), :meth:`Trainable.step`
(one iteration; return a dict of metrics, with ``"done": True`` to finish), and for
pausing, PBT or failure recovery :meth:`Trainable.save_checkpoint` /
:meth:`Trainable.load_checkpoint`. :meth:`Trainable.reset_config` lets one instance take a
new config when actors are reused. The runner calls :meth:`train`, :meth:`save` and
:meth:`restore`, which wrap those hooks and fill in Tune's automatic result keys.
"""

from __future__ import annotations

import copy
import os
import pickle
import socket
import tempfile
import time
from typing import Any

__all__ = ["Trainable"]

_DICT_CHECKPOINT_FILE = "_dict_checkpoint.pkl"


class Trainable:
    """Base class of class trainables (Ray's ``tune.Trainable``)."""

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.config: dict[str, Any] = config or {}
        self._iteration = int(kwargs.get("iteration", 0) or 0)
        self._time_total = float(kwargs.get("time_total_s", 0.0) or 0.0)
        self._trial_id = str(kwargs.get("trial_id", "default"))
        self._trial_name = str(kwargs.get("trial_name", "default"))
        self._logdir = str(kwargs.get("trial_dir", "") or tempfile.gettempdir())
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        self._restored = False
        self.setup(copy.deepcopy(self.config))

    # ---------------------------------------------------------------- hooks to override
    def setup(self, config: dict[str, Any]) -> None:
        """Set up the trial from its config (called once per instance, by ``__init__``)."""

    def step(self) -> dict[str, Any]:
        """Run one iteration and return its metrics (``"done": True`` ends the trial)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any] | None:
        """Write the state to ``checkpoint_dir`` (or return it as a dict)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement save_checkpoint() to be checkpointed"
        )

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        """Restore the state: the dict ``save_checkpoint`` returned, or its directory."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement load_checkpoint() to be restored"
        )

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Take a new config in place (actor reuse); return True if that worked."""
        return False

    def cleanup(self) -> None:
        """Release resources when the trial ends."""

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> dict[str, float] | None:
        """Resources a trial of this class needs (None: 1 CPU)."""
        return None

    # ---------------------------------------------------------------- properties
    @property
    def iteration(self) -> int:
        """How many iterations have run (across restores)."""
        return self._iteration

    @property
    def training_iteration(self) -> int:
        """Same as :attr:`iteration`."""
        return self._iteration

    @property
    def trial_id(self) -> str:
        """The trial's id."""
        return self._trial_id

    @property
    def trial_name(self) -> str:
        """The trial's name."""
        return self._trial_name

    @property
    def logdir(self) -> str:
        """The trial's folder."""
        return self._logdir

    # ---------------------------------------------------------------- called by the runner
    def train(self) -> dict[str, Any]:
        """Run :meth:`step` once and return its result with the automatic keys."""
        start = time.time()
        result = self.step()
        if not isinstance(result, dict):
            raise TypeError(
                f"{type(self).__name__}.step() must return a dict of metrics, "
                f"got {type(result).__name__}"
            )
        result = dict(result)
        elapsed = time.time() - start
        self._iteration += 1
        self._iterations_since_restore += 1
        self._time_total += elapsed
        self._time_since_restore += elapsed
        result.setdefault("done", False)
        result.update(
            training_iteration=self._iteration,
            time_this_iter_s=elapsed,
            time_total_s=self._time_total,
            time_since_restore=self._time_since_restore,
            iterations_since_restore=self._iterations_since_restore,
            timestamp=int(time.time()),
            pid=os.getpid(),
            hostname=socket.gethostname(),
        )
        return result

    def save(self, checkpoint_dir: str) -> str:
        """Save into ``checkpoint_dir`` (created if needed) and return it."""
        os.makedirs(checkpoint_dir, exist_ok=True)
        data = self.save_checkpoint(checkpoint_dir)
        if isinstance(data, dict):
            with open(os.path.join(checkpoint_dir, _DICT_CHECKPOINT_FILE), "wb") as f:
                pickle.dump(data, f)
        elif data is not None and os.path.abspath(str(data)) != os.path.abspath(checkpoint_dir):
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint() must return None or a dict, got {type(data).__name__}"
            )
        return checkpoint_dir

    def restore(self, checkpoint_dir: str) -> None:
        """Load a checkpoint that :meth:`save` wrote."""
        path = os.path.join(checkpoint_dir, _DICT_CHECKPOINT_FILE)
        if os.path.exists(path):
            with open(path, "rb") as f:
                self.load_checkpoint(pickle.load(f))
        else:
            self.load_checkpoint(checkpoint_dir)
        self._restored = True
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0

    def reset(self, new_config: dict[str, Any], **kwargs: Any) -> bool:
        """Reuse this instance for another trial: True if :meth:`reset_config` accepted it."""
        if not self.reset_config(copy.deepcopy(new_config)):
            return False
        self.config = new_config
        self._iteration = int(kwargs.get("iteration", 0) or 0)
        self._time_total = float(kwargs.get("time_total_s", 0.0) or 0.0)
        self._trial_id = str(kwargs.get("trial_id", self._trial_id))
        self._trial_name = str(kwargs.get("trial_name", self._trial_name))
        self._logdir = str(kwargs.get("trial_dir", self._logdir) or self._logdir)
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        return True

    def stop(self) -> None:
        """End the trial: calls :meth:`cleanup`."""
        self.cleanup()
