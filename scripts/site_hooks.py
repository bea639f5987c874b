"""Sphinx hooks for the site (loaded by _config.yml): solution blocks never reach a page."""
import json

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def setup(app):
    app.connect("source-read", hide_solutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def hide_solutions(app, docname, source):
    if not app.env.doc2path(docname).endswith(".ipynb"):
        return
    notebook = json.loads(source[0])
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["source"] = without_solutions("".join(cell["source"]))
    source[0] = json.dumps(notebook)


def without_solutions(code):
    """The code with each BEGIN/END SOLUTION block replaced by one line saying where the solution is."""
    kept, inside = [], False
    for line in code.splitlines(keepends=True):
        if line.strip() == BEGIN:
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            kept.append(f"{indent}...  # your turn: the solution is in the notebook\n")
        elif line.strip() == END:
            inside = False
        elif not inside:
            kept.append(line)
    return "".join(kept)
