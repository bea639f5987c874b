"""Make student copies of the lessons: every solution block becomes `raise NotImplementedError("your turn")`.

    python -m kvlesson.teaching.student notebooks/ student/            # refuses to replace copies already there
    python -m kvlesson.teaching.student notebooks/ student/ --force    # replaces them (a learner's edits are lost)

A solution block is the lines between `### BEGIN SOLUTION` and `### END SOLUTION` in a code cell, the
convention of nbgrader, the classroom standard. Each block becomes the stub, indented like its BEGIN line: the
replacement nbgrader's ClearSolutions makes (tests/test_teaching_student.py compares the two on every lesson), done
here in a few lines so that a learner's install, which has no nbgrader, makes the same copies
(`python -m kvlesson.teaching.workbook`). Around it, this tool adds what a classroom needs:
  - markers are checked first, and a broken one is reported with its file, cell and line;
  - no output that depends on a solved exercise survives: the outputs of every exercise cell are cleared, and so
    are those of every later cell that reads a name an exercise cell defined, or a name such a cell defined or
    changed (a checker's verdict, a score sheet, a table computed with the learner's function), followed cell by
    cell through the notebook (`dependent_cells`). A cell that binds a name afresh, from nothing that depends on an
    exercise, ends that name's dependence;
  - a markdown cell tagged `answer` (an explanation that gives an exercise's answer away) is replaced by a line
    saying where to read it; bug names, priced figures and model answers to checked parts belong in such cells,
    or in outputs, never in plain prose;
  - every notebook is converted, and every file it will write checked, before any is written, so one broken
    marker or one unwritable destination anywhere writes nothing;
  - it never writes into the folder it reads, and never replaces an existing copy unless told to (--force):
    a copy in the destination may hold a learner's work.
These copies need no nbgrader to use, and are graded by no one; for a class whose work is collected and graded,
`python -m kvlesson.teaching.course` makes an nbgrader course of the same lessons, with these same rules.
"""
import argparse
import ast
import functools
import re
import sys
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("your turn")'
# nbgrader's ClearSolutions set to replace a block as strip_solutions does: an nbgrader course's config (course.py)
CLEAR_SOLUTIONS = {"code_stub": {"python": STUB}, "begin_solution_delimeter": BEGIN, "end_solution_delimeter": END}
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"  # the solved lessons, in a clone of the repository
ANSWER_TAG = "answer"  # the cell tag of a markdown cell that gives an answer away
ANSWER_STUB = ("*(This explanation gives an exercise's answer away, so the student copy leaves it out. Read it in "
               "the lesson's solved copy, `notebooks/` in the repository, once the checker above says PASS.)*")


def strip_solutions(source, where="cell"):
    """Source text -> (student source, number of solution blocks). ValueError on unbalanced markers.

    Each block, its marker lines included, becomes one STUB line indented like its BEGIN line."""
    blocks = check_markers(source, where)
    kept, inside = [], False
    for line in source.split("\n"):
        if line.strip() == BEGIN:
            kept.append(line[:len(line) - len(line.lstrip())] + STUB)
        if line.strip() in (BEGIN, END):
            inside = line.strip() == BEGIN
        elif not inside:
            kept.append(line)
    return "\n".join(kept), blocks


def check_markers(source, where="cell"):
    """Count the solution blocks in `source`; ValueError naming `where` and the line of any broken marker.

    A marker must stand alone on its line. nbgrader treats any line that merely contains one as a marker, so a
    line such as `print("### BEGIN SOLUTION")` is refused here rather than silently cut.
    """
    blocks, start = 0, None
    for n, line in enumerate(source.split("\n"), 1):
        marker = line.strip()
        if marker == BEGIN:
            if start is not None:
                raise ValueError(f"{where}, line {n}: a second {BEGIN!r} before the {END!r} of line {start}'s block")
            start = n
        elif marker == END:
            if start is None:
                raise ValueError(f"{where}, line {n}: {END!r} without a {BEGIN!r} before it")
            start, blocks = None, blocks + 1
        elif BEGIN in line or END in line:
            raise ValueError(f"{where}, line {n}: a solution marker must stand alone on its line; got {line.strip()!r}")
    if start is not None:
        raise ValueError(f"{where}, line {start}: {BEGIN!r} is never closed by {END!r}")
    return blocks


def student_notebook(nb, name="notebook"):
    """A notebook -> (its student copy, number of solution blocks); the input is left untouched."""
    import nbformat

    nb = nbformat.from_dict(nb)  # a deep copy
    blocks = 0
    for i, cell in enumerate(nb.cells):  # markers first: a broken one is reported before anything else
        if cell.cell_type == "code":
            blocks += check_markers(cell.source, f"{name}, cell {i}")
    dependent = set(dependent_cells(nb.cells))
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source, f"{name}, cell {i}")[0]
            if i in dependent:
                cell.outputs, cell.execution_count = [], None
        elif cell.cell_type == "markdown" and ANSWER_TAG in cell.get("metadata", {}).get("tags", []):
            cell.source = ANSWER_STUB
    return nb, blocks


def dependent_cells(cells):
    """Indexes of the code cells whose outputs may depend on an exercise, in a list of notebook cells.

    An exercise cell (one with a solution block) depends on itself. A later code cell depends on an exercise when
    it reads a name that depends on one; it then taints what it binds (assignments, defs, loop and `with` targets,
    not the modules it imports) and what it changes through a method call or an item or attribute assignment
    (`sheet.check(...)`, `results[i] = ...`), modules excepted. A clean cell that rebinds a name at its top level,
    unconditionally, frees it. A cell whose source cannot be parsed depends on an exercise once any name does. The
    checker cell right after an exercise always depends on it.
    """
    tainted, imported, found, after_exercise = set(), set(), [], False
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = _text(cell.get("source", ""))
        names = _names(source)
        exercise = check_markers(source, f"cell {i}") > 0
        if exercise:
            depends = True
        elif names is None:
            depends = bool(tainted)
        else:
            depends = bool(names.reads & tainted) or after_exercise and "check" in source
        if names is not None:
            imported |= names.imports
            if depends:  # a module an exercise cell imports is the module, whatever the solution does
                tainted |= (names.binds - names.imports) | (names.changed - imported)
            else:
                tainted -= names.rebinds
        if depends:
            found.append(i)
        after_exercise = exercise
    return found


class _Names:
    """What one cell's code does with names."""

    def __init__(self):
        self.reads, self.binds, self.rebinds, self.changed, self.imports = set(), set(), set(), set(), set()


def _names(source):
    """_Names of a cell's source (IPython magics included), or None when it is not Python.

    Scopes count: a name a function (or lambda, comprehension, class body) binds is its own, so neither what it
    binds nor what it reads of its own locals is a module name."""
    code = _python(source)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    got = _Names()
    for statement in tree.body:
        _visit(statement, frozenset(), got, module=True)
    for statement in tree.body:  # what a top-level statement binds whatever happens
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            got.rebinds |= {n for t in targets for n in _unpacked(t)}
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            got.rebinds.add(statement.name)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            got.rebinds |= {(a.asname or a.name).split(".")[0] for a in statement.names}
    return got


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp,
           ast.GeneratorExp)


def _visit(node, local, got, module):
    """Walk `node`; `local` holds the names bound in the enclosing function scopes, `module` says whether a name
    stored here is a module name."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        _bind(node.name, local, got, module)
        for part in node.decorator_list + (node.bases + [k.value for k in node.keywords]
                                           if isinstance(node, ast.ClassDef) else _defaults(node.args)):
            _visit(part, local, got, module)
        inner = local | _locals(node)
        for statement in node.body:
            _visit(statement, inner, got, module=False)
        return
    if isinstance(node, ast.Lambda):
        for part in _defaults(node.args):
            _visit(part, local, got, module)
        _visit(node.body, local | _locals(node), got, module=False)
        return
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        inner = local | {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        for child in ast.iter_child_nodes(node):
            _visit(child, inner, got, module=False)
        return
    if isinstance(node, ast.Name):
        if isinstance(node.ctx, ast.Load):
            if node.id not in local:
                got.reads.add(node.id)
        else:
            _bind(node.id, local, got, module)
        return
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            name = (alias.asname or alias.name).split(".")[0]
            _bind(name, local, got, module)
            if module:
                got.imports.add(name)
        return
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        got.binds |= set(node.names) if isinstance(node, ast.Global) else set()
        return
    if isinstance(node, ast.ExceptHandler) and node.name:
        _bind(node.name, local, got, module)
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id not in local:
        got.reads.add(node.target.id)  # x += 1 reads x
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        got.changed |= _root(node.func.value) - local  # sheet.check(...), results.append(...)
        if node.func.attr in ("run_line_magic", "run_cell_magic", "system"):
            got.reads |= {s for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                          for s in re.findall(r"[A-Za-z_]\w*", a.value)}  # names inside a magic's text
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for target in targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)):
                got.changed |= _root(target.value) - local  # results[i] = ..., model.x = ...
    for child in ast.iter_child_nodes(node):
        _visit(child, local, got, module)


def _bind(name, local, got, module):
    if module:
        got.binds.add(name)


def _defaults(args):
    return [d for d in args.defaults + args.kw_defaults if d is not None]


def _locals(scope):
    """The names a function, lambda or class body binds for itself: its parameters and what it stores, less what
    it declares global; nested scopes keep theirs."""
    names, declared = set(), set()
    if not isinstance(scope, ast.ClassDef):
        a = scope.args
        names |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    todo = list(scope.body) if isinstance(scope.body, list) else [scope.body]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared |= set(node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(x.asname or x.name).split(".")[0] for x in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return names - declared


def _unpacked(target):
    """The names an assignment target binds: x, or each of a, b, *rest; none for x.a or x[i]."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _unpacked(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return {n for t in target.elts for n in _unpacked(t)}
    return set()


def _root(node):
    """{x} for x, x.a, x[i].b(...)...: the name an attribute or item chain starts from; {} for anything else, and
    for the result of calling a name (f(x).append(1) changes no named object)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                return set()
            node = node.func
        else:
            node = node.value
    return {node.id} if isinstance(node, ast.Name) else set()


def _python(source):
    """A cell's source as plain Python: IPython turns magics into calls (whose text _names reads for names)."""
    try:
        return _transformer().transform_cell(source)
    except ImportError:  # no IPython: magics stay as they are, and such a cell does not parse
        return source


@functools.cache
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager()


def _text(source):
    return source if isinstance(source, str) else "".join(source)


def write_student_copies(src, dest, force=False):
    """Every *.ipynb in src -> dest, solutions stripped. Returns [(path written, solution blocks)].

    ValueError, before anything is written, when src is not a folder of notebooks, when dest is src or lies
    inside it, when a notebook cannot be read or has a broken marker, when a copy exists in dest and not `force`,
    or when something other than a file stands where a copy must go. OSError while writing is the caller's to
    report; it too leaves every earlier copy as it was.
    """
    src, dest = Path(src), Path(dest)
    refuse_to_write_into(src, dest)
    copies = [(dest / path.name, *student_notebook(nb, path.name)) for path, nb in read_lessons(src)]
    write_notebooks([(path, nb) for path, nb, _ in copies], force)
    return [(path, blocks) for path, _, blocks in copies]


def refuse_to_write_into(src, dest):
    """ValueError when src is no folder, when dest is src or lies inside it, or when dest is not a folder."""
    src, dest = Path(src), Path(dest)
    if not src.is_dir():
        raise ValueError(f"{src} is not a folder of notebooks")
    if dest.resolve() == src.resolve() or src.resolve() in dest.resolve().parents:
        raise ValueError(f"refusing to write into {src}, the folder of solutions it reads; "
                         "pick a folder outside it, e.g. student/ or course/")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} exists and is not a folder")


def read_lessons(src):
    """[(path, notebook)] for every *.ipynb in the folder src, sorted; ValueError naming one nbformat cannot read,
    or when there is none."""
    import nbformat

    lessons = []
    for path in sorted(Path(src).glob("*.ipynb")):
        try:
            lessons.append((path, nbformat.read(path, as_version=4)))
        except Exception as e:  # nbformat raises JSON, validation and Unicode errors of several kinds
            raise ValueError(f"{path}: not a notebook nbformat can read ({type(e).__name__}: {e})") from None
    if not lessons:
        raise ValueError(f"no notebooks (*.ipynb) in {src}")
    return lessons


def write_notebooks(files, force=False):
    """Write every (path, notebook) of `files`, all or none, making the folders they need (a str in place of a
    notebook is written as text: an nbgrader config beside the course's notebooks).

    ValueError, before anything is written, when a file exists and not `force` (it may hold a learner's work), or
    when something other than a file stands where one must go. A write that fails (OSError, the caller's to report)
    leaves every earlier file as it was and no new folder behind.
    """
    import nbformat

    staged = [(path.with_name(f".{path.name}.tmp"), path, nb) for path, nb in files]
    blocked = [str(p) for tmp, path, _ in staged for p in (path, tmp) if p.exists() and not p.is_file()]
    if blocked:  # issue 19: with --force, a folder in the way stopped the run after some copies were written
        raise ValueError(f"{blocked[0]} is in the way: a folder (or another non-file) where a copy must go; nothing "
                         "was written. Move it, or pick another folder")
    there = [str(path) for path, _ in files if path.exists()]
    if there and not force:
        more = f" and {len(there) - 3} more" if len(there) > 3 else ""
        raise ValueError(f"{', '.join(there[:3])}{more} already exist and may hold a learner's work; "
                         "nothing was written. Pick another folder, or pass --force to replace them")
    missing = {d for path, _ in files for d in (path.parent, *path.parent.parents) if not d.exists()}
    made = []
    try:  # every file written beside its place first, so that a failure leaves the old ones as they were
        for folder in sorted(missing, key=lambda d: len(d.parts)):
            folder.mkdir()
            made.append(folder)
        for tmp, _, nb in staged:
            tmp.write_text(nb, encoding="utf-8") if isinstance(nb, str) else nbformat.write(nb, tmp)
    except BaseException:
        for tmp, _, _ in staged:
            tmp.unlink(missing_ok=True)
        for folder in reversed(made):
            folder.rmdir()
        raise
    for tmp, path, _ in staged:
        tmp.replace(path)  # a rename: no half-written notebook, ever


def refused_or_written(prog, dest, write):
    """-> what write() returns, or None after saying on stderr why it refused (ValueError) or could not write
    (OSError): the one error path of the command-line tools that write notebooks."""
    try:
        return write()
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
    except OSError as e:
        print(f"{prog}: could not write {e.filename or dest}: {e.strerror}", file=sys.stderr)
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvlesson.teaching.student", description=__doc__.split("\n")[0])
    parser.add_argument("src", help="folder of lesson notebooks, e.g. notebooks/")
    parser.add_argument("dest", help="folder for the student copies, e.g. student/")
    parser.add_argument("--force", action="store_true", help="replace copies already in dest (their edits are lost)")
    args = parser.parse_args(argv)
    written = refused_or_written("kvlesson.teaching.student", args.dest,
                                 lambda: write_student_copies(args.src, args.dest, force=args.force))
    if written is None:
        return 1
    for path, blocks in written:
        print(f"{path}: {blocks} solution block{'s' if blocks != 1 else ''} replaced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
