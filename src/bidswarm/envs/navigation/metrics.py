"""VLN-CE episode metrics: success, SPL, nDTW and navigation error, kept incrementally.

Shared by the embedded task and the Habitat adapter. Positions are 2-D points on the floor plane
(metres). The running state is a few floats (see :meth:`PathMetrics.state`), so a fork restores
it exactly without replaying the path.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

Point = tuple[float, float]


class PathMetrics:
    """Bookkeeping of one episode's path against its reference path.

    reference:          the reference path (start ... goal) the nDTW compares with.
    shortest_distance:  geodesic start-to-goal distance (the ``l`` of SPL).
    success_distance:   success radius, also nDTW's distance threshold ``d_th`` (3 m in VLN-CE).
    """

    def __init__(
        self, reference: Sequence[Point], shortest_distance: float, success_distance: float
    ):
        if not reference:
            raise ValueError("the reference path needs at least one point")
        self.reference = tuple((float(x), float(y)) for x, y in reference)
        self.shortest_distance = float(shortest_distance)
        self.success_distance = float(success_distance)
        self.path_length = 0.0
        self.position: Point = self.reference[0]
        self._dtw_column: tuple[float, ...] = ()

    def start(self, position: Point) -> None:
        """Begin the path at ``position``."""
        self.path_length = 0.0
        self.position = position
        self._dtw_column = ()
        self._extend_dtw(position)

    def add(self, position: Point) -> None:
        """Record the next position of the path (after an atomic step that changed it)."""
        self.path_length += math.dist(self.position, position)
        self.position = position
        self._extend_dtw(position)

    def _extend_dtw(self, position: Point) -> None:
        """One more column of the DTW table (rows: reference points, columns: path points)."""
        previous = self._dtw_column
        column: list[float] = []
        above = math.inf
        for row, point in enumerate(self.reference):
            cost = math.dist(point, position)
            if previous:
                diagonal = previous[row - 1] if row > 0 else math.inf
                best = min(previous[row], diagonal, above)
            else:
                best = 0.0 if row == 0 else above
            above = cost + best
            column.append(above)
        self._dtw_column = tuple(column)

    @property
    def dtw(self) -> float:
        """Dynamic-time-warping distance of the path so far to the whole reference path."""
        return self._dtw_column[-1] if self._dtw_column else math.inf

    def summary(self, distance_to_goal: float, stopped: bool) -> dict[str, float]:
        """The VLN-CE metrics; success needs a ``stop`` within the success radius."""
        success = float(stopped and distance_to_goal <= self.success_distance)
        longest = max(self.path_length, self.shortest_distance)
        spl = success * self.shortest_distance / longest if longest > 0 else success
        ndtw = math.exp(-self.dtw / (len(self.reference) * self.success_distance))
        return {
            "success": success,
            "spl": spl,
            "ndtw": ndtw,
            "navigation_error": float(distance_to_goal),
            "path_length": self.path_length,
        }

    # -- fork contract -------------------------------------------------------------------------
    def state(self) -> tuple:
        """Plain data that restores the running metrics exactly."""
        return (self.path_length, self.position, self._dtw_column)

    def load(self, state: tuple) -> None:
        """Return to a :meth:`state`."""
        self.path_length, self.position, self._dtw_column = state


def resample_path(points: Sequence[Point], spacing: float) -> list[Point]:
    """Points every ``spacing`` metres along a polyline (its ends kept)."""
    if not points:
        return []
    resampled = [points[0]]
    for start, end in itertools.pairwise(points):
        length = math.dist(start, end)
        pieces = max(1, math.ceil(length / spacing - 1e-9))
        for piece in range(1, pieces + 1):
            t = piece / pieces
            resampled.append(
                (start[0] + t * (end[0] - start[0]), start[1] + t * (end[1] - start[1]))
            )
    return resampled
