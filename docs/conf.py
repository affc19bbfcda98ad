"""Sphinx configuration for the dask_cosim documentation (``make docs``).

The build is offline: no intersphinx inventories are fetched.
"""

from __future__ import annotations

import dask_cosim

project = "dask_cosim"
author = "dask_cosim developers"
copyright = "dask_cosim developers"
version = release = dask_cosim.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx_click",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Pages are Markdown (MyST); ```{eval-rst} blocks carry the autodoc directives.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# API reference: one page per object, generated from the docstrings at build time.
autosummary_generate = True
autodoc_typehints = "none"  # numpydoc renders the documented types
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = f"dask_cosim {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_static_path: list[str] = []
