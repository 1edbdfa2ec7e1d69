"""Sizes of the package's modules: per module its lines (all, and without docstrings), its largest class and its
largest function, both counted without docstrings (the structure targets: modules <= 400 lines, classes <= 250,
functions <= 50). Usage: python ci/sizes.py [paths...] (default: hvd_elastic/)."""
import ast
import pathlib
import sys


def _docstring_lines(node) -> set:
    """Line numbers of the docstrings of `node` and of every class or function inside it."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def _size(node) -> int:
    span = set(range(node.lineno, node.end_lineno + 1))
    return len(span - _docstring_lines(node))


def report(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    lines = len(path.read_text().splitlines())
    code = lines - len(_docstring_lines(tree))
    classes = [(n.name, _size(n)) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    funcs = [(n.name, _size(n)) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    big_c = max(classes, key=lambda x: x[1], default=("-", 0))
    big_f = max(funcs, key=lambda x: x[1], default=("-", 0))
    return lines, code, big_c, big_f


def main(args):
    roots = [pathlib.Path(a) for a in args] or [pathlib.Path("hvd_elastic")]
    files = sorted(f for r in roots for f in ([r] if r.is_file() else r.rglob("*.py")))
    print(f"{'module':44} {'lines':>5} {'code':>5}  {'largest class':30} {'largest function':30}")
    for f in files:
        lines, code, (cn, cs), (fn, fs) = report(f)
        print(f"{str(f):44} {lines:5} {code:5}  {f'{cn} {cs}':30} {f'{fn} {fs}':30}")


if __name__ == "__main__":
    main(sys.argv[1:])
