"""The model registry: object stores, immutable versions, the production pointer, promotion."""
