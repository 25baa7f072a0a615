"""Deep research over an offline corpus: Searcher, Opener and Finder (docs/method.md section 6)."""

from __future__ import annotations

from bidswarm.envs.research.config import ResearchConfig
from bidswarm.envs.research.env import ResearchEnv

__all__ = ["ResearchConfig", "ResearchEnv"]
