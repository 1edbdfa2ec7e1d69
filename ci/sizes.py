"""Size check of the package (the structure targets): every module's lines, its largest class and largest function,
docstrings excluded. Prints the ones over the limits (module 400, class 250, function 50) and exits 1 if any.

    python ci/sizes.py [--all]
"""
import ast
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hvd_elastic")
LIMITS = {"module": 400, "class": 250, "function": 50}


def _docstring_lines(node) -> int:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0].end_lineno - body[0].lineno + 1
    return 0


def _size(node) -> int:
    """Lines of a definition, less the docstrings of it and of everything defined inside it."""
    docs = sum(_docstring_lines(n) for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                              ast.ClassDef, ast.Module)))
    return node.end_lineno - node.lineno + 1 - docs


def measure(path):
    tree = ast.parse(open(path).read())
    lines = len(open(path).read().splitlines()) - sum(_docstring_lines(n) for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)))
    classes = [(n.name, _size(n)) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    funcs = [(n.name, _size(n)) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return lines, max(classes, key=lambda c: c[1], default=("-", 0)), max(funcs, key=lambda f: f[1], default=("-", 0))


def main():
    over = False
    for dirpath, _, files in sorted(os.walk(ROOT)):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            lines, (cname, csize), (fname, fsize) = measure(path)
            bad = lines > LIMITS["module"] or csize > LIMITS["class"] or fsize > LIMITS["function"]
            over |= bad
            if bad or "--all" in sys.argv:
                print(f"{'OVER ' if bad else '     '}{os.path.relpath(path, ROOT):<32} {lines:>5} lines  "
                      f"class {cname} {csize}  function {fname} {fsize}")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
