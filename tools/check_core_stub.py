"""Checks src/kbcore/_core.pyi's parameter lists against the built extension.

stubtest cannot see a pybind11 function's parameters (the builtins carry no
``__text_signature__``), but pybind11 writes each signature as the first line of the
docstring: ``name(self: kbcore._core.Index, k: int, filter: object = None) -> ...``. This
compares, for every function and method of the stub, the parameter names, their order and
which have defaults. Exit status 1 on a mismatch, with one line per problem.

    python tools/check_core_stub.py        (after the extension is built and installed)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

STUB = Path(__file__).resolve().parents[1] / "src" / "kbcore" / "_core.pyi"

Params = list[tuple[str, bool]]  # (name, has a default)


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def runtime_params(obj: object, name: str) -> Params | None:
    """The parameters in pybind11's docstring signature, without ``self``; None if it has none."""
    doc = (getattr(obj, "__doc__", None) or "").lstrip()
    first = doc.split("\n", 1)[0]
    if not first.startswith(name + "("):
        return None
    depth, end = 0, -1
    for i, ch in enumerate(first):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    inner = first[len(name) + 1 : end]
    out: Params = []
    for part in _split_top_level(inner):
        head = part.split(":", 1)[0].split("=", 1)[0].strip()
        if head and head != "self":
            out.append((head, "=" in part))
    return out


def stub_params(fn: ast.FunctionDef) -> Params:
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    out = [(a.arg, d) for a, d in zip(positional, defaults, strict=True) if a.arg not in ("self", "cls")]
    out += [(a.arg, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return out


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "property") or (isinstance(d, ast.Attribute) and d.attr == "setter")
        for d in fn.decorator_list
    )


def check() -> list[str]:
    import kbcore._core as core  # noqa: TID251 -- this tool checks the native module itself

    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    problems: list[str] = []

    def compare(qual: str, runtime_obj: object, fn: ast.FunctionDef) -> None:
        want = runtime_params(runtime_obj, fn.name)
        if want is None:
            problems.append(f"{qual}: the extension gives no signature to compare")
            return
        got = stub_params(fn)
        if got != want:
            problems.append(f"{qual}: stub has {got}, the extension has {want}")

    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            compare(node.name, getattr(core, node.name), node)
        elif isinstance(node, ast.ClassDef):
            cls = getattr(core, node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not _is_property(item):
                    compare(f"{node.name}.{item.name}", getattr(cls, item.name), item)
    return problems


def main() -> int:
    problems = check()
    for p in problems:
        print(p)
    if not problems:
        print("_core.pyi: every parameter list matches the extension")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
