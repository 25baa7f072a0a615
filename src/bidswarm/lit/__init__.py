"""Lightning modules: the SFT cold start and MPT training of a swarm, and their callbacks."""
