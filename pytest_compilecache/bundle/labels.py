"""How bundles name environments in messages: short labels and differences, printable on one line."""

from __future__ import annotations

import re
from typing import Mapping

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with control characters, line breaks, direction overrides and lone surrogates escaped (``\\n``)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def env_label(env: Mapping[str, str]) -> str:
    """A short human name for an environment, e.g. ``torch 2.13.0+cpu on cpu``."""
    return printable(f"torch {env.get('torch', '?')} on {env.get('device', '?')}")


def differences(bundle_env: Mapping[str, str], here: Mapping[str, str]) -> list[str]:
    """``field: bundle X, here Y`` for every field where two environments differ."""
    keys = list(here) + [k for k in bundle_env if k not in here]
    return [printable(f"{k}: bundle {bundle_env.get(k, '(absent)')!s}, here {here.get(k, '(absent)')!s}")
            for k in keys if bundle_env.get(k) != here.get(k)]
