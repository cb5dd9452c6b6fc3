"""tinker-serve domain code: wire types, training, storage and futures (no Ray Serve imports)."""
