"""Sphinx hooks for the site (loaded by _config.yml): a lesson's page shows what its student copy shows.

Each notebook is read as `python -m kvlesson.teaching.student` would hand it out (kvlesson.teaching.student's
`student_notebook`, the one implementation): every solution block is `raise NotImplementedError("your turn")`, the
outputs that depend on an exercise are cleared (a checker's PASS, lesson 12's suspects and price sheet), and a markdown
cell tagged `answer` is the line that says where to read it. Issue 32: the site stripped the solution code only, and
lesson 12's page named every suspect's bug.
"""
import json

import nbformat

from kvlesson.teaching.student import student_notebook


def setup(app):
    app.connect("source-read", as_student_copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def as_student_copy(app, docname, source):
    if not app.env.doc2path(docname).endswith(".ipynb"):
        return
    copy, _ = student_notebook(nbformat.reads(source[0], as_version=4), f"{docname}.ipynb")
    source[0] = json.dumps(copy)
