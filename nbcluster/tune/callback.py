"""``Callback``: hooks into a Tune run (``RunConfig(callbacks=[...])``), as in Ray.

Every hook is called in the driver with keyword arguments: ``iteration`` (the controller
loop's count), ``trials`` (every trial) and ``trial``/``result``/``checkpoint`` where
they apply. Subclass and override what you need.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Callback"]


class Callback:
    """Base class of Tune callbacks (every hook does nothing by default)."""

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """A trial started or resumed."""

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        """A trial reported a result."""

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """A trial ended TERMINATED."""

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """A trial failed (it may be retried)."""

    def on_checkpoint(
        self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any, **info: Any
    ) -> None:
        """A trial's checkpoint was persisted."""

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """The run ended (finished, stopped or interrupted)."""
