"""DDPJob operator: turns each DDPJob into a headless Service and one Pod per rank."""
