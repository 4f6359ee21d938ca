"""The provider's version (the package metadata reads it here)."""

__version__ = "0.2.0"
