"""Credentials in URLs (an index's token, a checkpoint URI's keys) never shown: redacted or masked where they appear.

Rule S1 of docs/security.md: a credential a DAG author wrote reaches no log of any process, no rendered field, no import
error, no XCom. The provider's own messages redact URLs (``runtime/protocol.py``'s ``redact``: import errors,
the scheduler's log, the runtime's lines, installer output, ``ImageSettings``' repr); in the task process every
credential of the task's URLs is also registered with Airflow's secrets masker when the templates are rendered, so
that Airflow's task log and the Rendered Template view show ``***`` too (:class:`MasksCredentials`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?P<userinfo>\S*)@")


def credentials(text: str) -> list[str]:
    """The credentials in the URLs of ``text``: each ``user:password``, and the password (or token) alone."""
    found = []
    for match in _USERINFO.finditer(text):
        userinfo = match["userinfo"]
        found.append(userinfo)
        user, _, password = userinfo.partition(":")
        found.extend(part for part in (password, user if not password else "") if len(part) >= 4)
    return found


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _strings(item)


def mask(values: Iterable[Any]) -> None:
    """Register every credential in ``values`` (strings, nested) with Airflow's secrets masker."""
    from airflow.sdk.log import mask_secret

    for text in (text for value in values for text in _strings(value)):
        for secret in credentials(text):
            mask_secret(secret)


class MasksCredentials:
    """An operator whose rendered fields' and image's credentials are masked before Airflow stores or logs them."""

    template_fields: Any
    task_spec: Any

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render, then mask every credential of the rendered fields and of the image's URLs."""
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]
        image = self.task_spec.image
        mask(
            [getattr(self, name, None) for name in self.template_fields]
            + [image.index_url, image.extra_index_urls, image.find_links]
        )
