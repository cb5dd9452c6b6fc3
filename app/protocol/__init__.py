"""Tinker wire types and the protobuf/zstd/JSON codec."""
