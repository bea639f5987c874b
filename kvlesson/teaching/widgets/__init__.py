"""Interactive explorers: thin ipywidgets wrappers over pure, tested functions.

Import the one you need, e.g. `from kvlesson.teaching.widgets.mask import mask_explorer`; this package
imports nothing heavy by itself, so kvlesson works where ipywidgets is not installed.
"""
