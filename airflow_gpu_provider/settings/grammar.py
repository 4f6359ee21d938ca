"""The text grammars of the settings, in one place, each compiled when first used.

Every DAG-parse process imports the settings, and compiling a regular expression costs more than most of what a
task does at parse; a DAG that never names an image or an accelerator never compiles their grammars.
"""

from __future__ import annotations

import functools
import re
from typing import Any


class Grammar:
    """A regular expression compiled on first use; ``fullmatch``, ``match``, ``search``... as ``re.Pattern``'s."""

    def __init__(self, pattern: str, flags: int = re.ASCII) -> None:
        self.pattern, self.flags = pattern, flags

    @functools.cached_property
    def compiled(self) -> re.Pattern[str]:
        """The compiled expression."""
        return re.compile(self.pattern, self.flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)


# Matched whole (fullmatch): "$" alone would let a trailing newline through into a resource name.
ACCELERATOR = Grammar(r"(?P<model>[A-Za-z0-9][A-Za-z0-9._-]*)(:(?P<count>[^:]*))?")
MIG_PROFILE = Grammar(r"[1-9][0-9]*g\.[1-9][0-9]*gb(\+me)?")
# ASCII only: str.isdigit() and \d also take "２", "٣" or "¹", which Kubernetes and Docker do not.
DECIMAL = Grammar(r"[0-9]+")
FRACTION = Grammar(r"0?\.[0-9]{1,4}")  # a share of one GPU, as a rendered template gives it: "0.5"
QUANTITY = Grammar(r"\s*(?P<number>[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?)\s*(?P<suffix>[A-Za-z]*)\s*")
# A Docker image reference: [registry[:port]/]name[/name...][:tag][@sha256:digest]
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = Grammar(
    rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?"
)
ENV_NAME = Grammar(r"[A-Za-z_][A-Za-z0-9_]*")
VENDOR_NAME = Grammar(r"[a-z0-9][a-z0-9-]*")
RESOURCE_NAME = Grammar(r"([a-z0-9.-]+/)?[A-Za-z0-9][A-Za-z0-9._-]*")  # a Kubernetes extended resource
