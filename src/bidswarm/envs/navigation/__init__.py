"""VLN-CE R2R-style navigation: Turner / Mover / Stopper (docs/method.md section 6).

``NavigationEnv`` is the embedded task (procedural houses, pure Python);
``bidswarm.envs.navigation.habitat`` runs the same roles and action language on habitat-lab's
VLN-CE R2R episodes when habitat is installed.
"""

from __future__ import annotations

from bidswarm.envs.navigation.config import NavigationConfig
from bidswarm.envs.navigation.env import NavigationEnv

__all__ = ["NavigationConfig", "NavigationEnv"]
