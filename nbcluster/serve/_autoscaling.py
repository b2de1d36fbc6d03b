"""The autoscaling decision: Ray Serve's default policy, as pure functions.

The controller records each deployment's total ongoing requests (what its replicas
report, summed) as a time series; every control-loop tick it asks
:func:`decide` for the new target replica count. Nothing here reads a clock or talks to
a process: time comes in as ``now``, and the per-deployment memory of the policy (when
a pending up- or downscale decision started) is the :class:`PolicyState` passed in and
returned.

The rule (Ray's ``replica_queue_length_autoscaling_policy``): the desired count is the
average total ongoing requests over ``look_back_period_s`` divided by
``target_ongoing_requests``, moved towards by ``upscaling_factor`` /
``downscaling_factor``, clipped to ``[min_replicas, max_replicas]``; a scale-up happens
once the desire has lasted ``upscale_delay_s``, a scale-down once it has lasted
``downscale_delay_s`` (``downscale_to_zero_delay_s`` for the last replica). From zero
replicas any demand scales up at once.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

from nbcluster.serve.config import AutoscalingConfig

__all__ = ["MetricWindow", "PolicyState", "decide", "desired_replicas"]

_EPS = 1e-6


@dataclasses.dataclass
class PolicyState:
    """What the policy remembers between ticks: the direction and start of a pending decision."""

    direction: int = 0  # +1 wants more replicas, -1 fewer, 0 content
    since: float | None = None


class MetricWindow:
    """A time series of one deployment's total ongoing requests, averaged over a window."""

    def __init__(self) -> None:
        self._points: deque[tuple[float, float]] = deque()

    def record(self, now: float, total_ongoing: float) -> None:
        """Add one sample taken at ``now``."""
        self._points.append((now, float(total_ongoing)))

    def average(self, now: float, look_back_s: float) -> float | None:
        """Mean of the samples of the last ``look_back_s`` seconds (None without samples)."""
        while self._points and self._points[0][0] < now - look_back_s:
            self._points.popleft()
        if not self._points:
            return None
        return sum(v for _, v in self._points) / len(self._points)

    def __len__(self) -> int:
        return len(self._points)


def desired_replicas(total_ongoing: float, current: int, config: AutoscalingConfig) -> int:
    """The replica count the load asks for, before delays (clipped to the config's range)."""
    raw = total_ongoing / config.target_ongoing_requests
    if current == 0:
        desired = math.ceil(raw)
    else:
        delta = raw - current
        factor = config.get_upscaling_factor() if delta > 0 else config.get_downscaling_factor()
        desired = math.ceil(current + factor * delta - _EPS)
        if math.ceil(raw - _EPS) < current and desired == current:
            desired -= 1  # a fractional factor must not stall a scale-down forever
    return max(config.min_replicas, min(config.max_replicas, desired))


def decide(
    *,
    total_ongoing: float | None,
    current: int,
    target: int,
    config: AutoscalingConfig,
    state: PolicyState,
    now: float,
) -> int:
    """The new target replica count (``target`` when nothing changes); updates ``state``.

    ``total_ongoing`` is the windowed average (None: no metrics yet, keep the target);
    ``current`` the replicas running now, ``target`` the present goal.
    """
    if total_ongoing is None:
        return max(config.min_replicas, min(config.max_replicas, target))
    desired = desired_replicas(total_ongoing, current, config)
    if current == 0 and desired > 0:
        state.direction, state.since = 0, None
        return desired  # cold start: no delay
    if desired > target:
        if state.direction != 1:
            state.direction, state.since = 1, now
        assert state.since is not None
        if now - state.since + _EPS >= config.upscale_delay_s:
            state.direction, state.since = 0, None
            return desired
        return target
    if desired < target:
        if state.direction != -1:
            state.direction, state.since = -1, now
        assert state.since is not None
        delay = config.downscale_delay_s
        if target == 1 and desired == 0 and config.downscale_to_zero_delay_s is not None:
            delay = config.downscale_to_zero_delay_s
        if now - state.since + _EPS >= delay:
            state.direction, state.since = 0, None
            return desired
        return target
    state.direction, state.since = 0, None
    return target
