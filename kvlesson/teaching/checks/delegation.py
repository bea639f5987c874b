"""Does a learner's answer call the very function the exercise asks for? A checker that compares with kvlesson's own
function cannot tell an answer from a call to that function, so the exercises of lessons 13 and 14 ask it.

The test reads the answer's code, not its behaviour: every global name its code (and the code of functions nested in
it, and of a class's own methods) uses, resolved in the answer's module, and every value it closes over. A name that
is the reference itself, or an attribute named there of a module or class it names (`engine.split_budget`), or a
`super().<name>` call to the method the exercise overrides, counts as a call. Code that hides the call (getattr
with a string built at run time) is not seen; the checkers' other cases still hold it to the exercise's contract.
"""
import dis
import types

__all__ = []


def _codes(fn):
    """-> every code object of fn: its own, nested ones, and, for a class, those of the methods it defines."""
    if isinstance(fn, type):
        found = []
        for value in vars(fn).values():
            found += _codes(getattr(value, "__func__", value))
        return found
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return []
    stack, found = [code], []
    while stack:
        c = stack.pop()
        found.append(c)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return found


def _namespaces(fn):
    """-> (globals, closed-over values) of fn, or of every method of a class."""
    if isinstance(fn, type):
        pairs = [_namespaces(getattr(v, "__func__", v)) for v in vars(fn).values() if callable(v)]
        globs = {}
        for g, _ in pairs:
            globs.update(g)
        return globs, [x for _, cells in pairs for x in cells]
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return getattr(fn, "__globals__", {}) or {}, cells


def calls(fn, reference, method=None):
    """Whether `fn` (a function or a class) names `reference` in its code: directly, as an attribute of a module it
    names, or, for a class, as super().`method`."""
    if fn is reference:
        return True
    try:
        codes = _codes(fn)
        names = {n for c in codes for n in c.co_names}
        globs, cells = _namespaces(fn)
        if any(x is reference for x in cells) or any(globs.get(n) is reference for n in names):
            return True
        owners = [globs[n] for n in names if isinstance(globs.get(n), (types.ModuleType, type))]
        if any(getattr(m, n, None) is reference for m in owners for n in names):
            return True
        return method is not None and "super" in names and method in names and _super_call(codes, method)
    except Exception:  # an answer whose code cannot be read is judged on its behaviour alone
        return False


def _super_call(codes, method):
    """Whether some code loads `super` and then the attribute `method` (super().method(...))."""
    for c in codes:
        ops = [(i.opname, i.argval) for i in dis.get_instructions(c)]
        seen_super = False
        for op, arg in ops:
            if arg == "super" and op in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"):
                seen_super = True
            elif seen_super and arg == method and op in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"):
                return True
    return False


def refuse_delegation(fn, reference, name, method=None):
    """A NOT YET when `fn` calls `reference` (kvlesson's `name`) instead of doing the exercise."""
    from kvlesson.teaching.verdict import reject

    if calls(fn, reference, method):
        reject(f"your answer calls kvlesson's {name}, the very function this exercise asks you to write",
               "the point is to work it out: write it with plain Python and numpy (kvlesson's own stays in reach for "
               "the cells after the exercise, which fall back on it while yours does not pass)")
