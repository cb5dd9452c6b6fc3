"""Checkpoint storage: validated tinker paths, and the filesystem (local or object store) holding them."""
