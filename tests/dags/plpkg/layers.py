"""A submodule of the project package."""

NAME = "layers of plpkg"
