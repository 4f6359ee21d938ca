"""docs/architecture.md stays true: every module it names exists, every module of the package is on its tree.

A failure says exactly what to add to (or remove from) the map, so that whoever adds a module (a backend, a runtime
half) fixes the map in the same change.
"""

from __future__ import annotations

import re

from conftest import REPO

MAP = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "airflow_gpu_provider"
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _without_parentheses(text: str) -> str:
    while True:
        stripped = re.sub(r"\([^()]*\)", " ", text)
        if stripped == text:
            return text
        text = stripped


def tree(text: str) -> dict[str, list[str]]:
    """The map's tree: folder (``""`` for the package's root, ``backends/docker/``) -> the module names on its lines.

    A line whose first word ends with ``/`` (or is ``(root)``) starts a folder, inside the folder of the nearest
    line above it indented less; the other lines go on the folder above them. Words in parentheses are comments.
    """
    block = text.split("## The tree", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    folders: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []  # (indent, folder) of the folders enclosing the current line
    current = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        indent, first, names = len(line) - len(line.lstrip()), line.split()[0], line
        if first == "(root)" or first.endswith("/"):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            current = "" if first == "(root)" else (stack[-1][1] if stack else "") + first
            stack.append((indent, current))
            names = line.replace(first, " ", 1)
        folders.setdefault(current, []).extend(w for w in _without_parentheses(names).split() if NAME.match(w))
    return folders


def _modules() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        folder = path.parent.relative_to(PACKAGE).as_posix()
        found.setdefault("" if folder == "." else f"{folder}/", set()).add(path.stem)
    return found


def test_every_module_named_on_the_map_exists_and_every_module_is_on_it():
    on_map, modules = tree(MAP.read_text()), _modules()
    stale = [
        f"{folder}{name}" for folder, names in on_map.items() for name in names if name not in modules.get(folder, ())
    ]
    missing = {
        folder: sorted(names - set(on_map.get(folder, [])) - {"__init__"}) for folder, names in sorted(modules.items())
    }
    missing = {folder: names for folder, names in missing.items() if names}
    what = [
        f"docs/architecture.md's tree lacks {folder or '(root) '}: add "
        + " ".join(names)
        + (" to that folder's line" if folder in on_map else f" on a new line '{folder.rstrip('/').rsplit('/', 1)[-1]}/"
           f"  {' '.join(names)}' indented two spaces under {folder.rstrip('/').rpartition('/')[0] or 'the root'}/")
        for folder, names in missing.items()
    ]  # fmt: skip
    what += [
        f"docs/architecture.md names {name}, which is no module of the package any more: remove it" for name in stale
    ]
    assert not what, "\n".join(what)


def test_every_path_the_map_mentions_exists():
    """``operators/spec.py``, ``host/waiting.MustWait``, ``tests/backends/fourth_backend.py``, ``deploy/``..."""
    text = MAP.read_text()
    mentioned = set(re.findall(r"`([a-z_.]+(?:/[A-Za-z_.<>]+)+/?)[.`(\s]", text))
    missing = []
    for path in sorted(mentioned):
        if "<" in path:
            continue  # backends/<name>/plan.py: a pattern
        module = re.sub(r"\.[A-Za-z_]+$", "", path) if not path.endswith((".py", ".json", ".yaml", "/")) else path
        candidates = [module, f"{module}.py", path]
        if not any((base / c).exists() for base in (PACKAGE, REPO) for c in candidates):
            missing.append(path)
    assert not missing, f"docs/architecture.md mentions paths that do not exist: {missing}"


def test_the_tree_reader_reads_nested_folders_and_comments():
    text = "## The tree\n```text\n(root)  a (x (y) z) b\nbk/  c\n  one/  d\n    deep/  e\n  two/  f (g)\n        h\nz/  i\n```"
    assert tree(text) == {"": ["a", "b"], "bk/": ["c"], "bk/one/": ["d"], "bk/one/deep/": ["e"], "bk/two/": ["f", "h"],
                          "z/": ["i"]}  # fmt: skip
