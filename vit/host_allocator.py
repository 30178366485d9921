"""Compatibility name: huge pages for XLA:CPU's scratch memory live in `vit.cpu.huge_pages`."""

from vit.cpu.huge_pages import (  # noqa: F401
    MIN_GLIBC,
    THP_MODE,
    TUNABLE,
    environment,
    glibc_version,
    huge_pages_on_request,
    reexec,
    wanted,
)
