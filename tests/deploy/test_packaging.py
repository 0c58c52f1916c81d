"""The project's metadata is what current setuptools wants: installing it prints no
deprecation warning, and the build requirement admits only setuptools that understand it."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

from packaging.requirements import Requirement
from setuptools import find_packages
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_metadata_gives_setuptools_nothing_to_warn_about() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SetuptoolsDeprecationWarning fails the test
        dist = apply_configuration(Distribution(), PYPROJECT)
    assert dist.metadata.license_expression == "MIT"  # an SPDX expression


def test_the_build_requires_a_setuptools_that_reads_an_spdx_license() -> None:
    project = tomllib.loads(PYPROJECT.read_text())
    (setuptools,) = (
        r for r in map(Requirement, project["build-system"]["requires"]) if r.name == "setuptools"
    )
    # setuptools reads `license = "<SPDX expression>"` from 77.0.0 on
    assert "77.0.0" in setuptools.specifier and "76.1.0" not in setuptools.specifier
    classifiers = project["project"].get("classifiers", [])
    assert not [c for c in classifiers if c.startswith("License ::")]


def test_the_wheel_carries_the_two_packages_and_none_of_the_test_helpers() -> None:
    """bench/ and harness/ are packages too (so that ``python -m bench.NAME`` runs from the
    repository), but they are not installed: only fedrecgel and services are found."""
    project = tomllib.loads(PYPROJECT.read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    found = find_packages(where=str(PYPROJECT.parent), include=include)
    assert {name.split(".")[0] for name in found} == {"fedrecgel", "services"}
