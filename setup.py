"""Setuptools shim: the metadata lives in setup.cfg, but for the package list, which setup.cfg's ``find:`` cannot
extend: accelpatch and its subpackages, plus ``accelpatch.recipe_files``, the top-level ``recipes/`` folder (the
shipped recipes, package data) that setup.cfg's ``package_dir`` maps into the package."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["accelpatch", "accelpatch.*"]) + ["accelpatch.recipe_files"])
