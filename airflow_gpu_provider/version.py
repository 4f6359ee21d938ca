"""The provider's version (the package metadata reads it here)."""

__version__ = "0.1.0"
