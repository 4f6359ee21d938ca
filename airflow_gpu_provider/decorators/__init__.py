"""TaskFlow decorators."""
