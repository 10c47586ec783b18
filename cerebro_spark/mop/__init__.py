"""Model hopper parallelism: the pure MOP scheduler and its schedule simulator."""
