"""Packaging beside pyproject.toml, for the one thing its tables cannot say: the recipes in
configs/ ship inside the package as `vit.recipes.builtin` (a folder mapped to a package name
besides the packages found), so `vit train --config digits` works from an installed wheel."""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["vit", "vit.*"]), "vit.recipes.builtin"],
      package_dir={"vit.recipes.builtin": "configs"})
