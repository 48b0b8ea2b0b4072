"""The plugin's settings, resolved once per process: command line over environment over ini."""

from __future__ import annotations

import enum
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..bundle.format import BundleError
from ..storage.errors import DEFAULT_TIMEOUT as DEFAULT_NETWORK_TIMEOUT
from ..storage.errors import MIN_RATE
from ..storage.urls import STORAGE_OPTIONS_ENV, file_url_path, is_url, parse_storage_options, redacted
from .remote import check_url

DEFAULT_LOCK_TIMEOUT = 900.0
#: Updating runs of the whole suite after which an artifact none of them used is dropped (an edit's old entry).
DEFAULT_MAX_UNUSED_RUNS = 10
BUNDLE_ENV = "PYTEST_COMPILE_CACHE_BUNDLE"
REMOTE_ENV = "PYTEST_COMPILE_CACHE_REMOTE"


class Isolation(enum.Enum):
    """What ``--compile-cache-isolate`` gives the tests that ask for no fixture."""

    OFF = "off"
    TEST = "test"
    WORKER = "worker"


#: The isolation modes' words, the same on the command line, in the ini file and in messages.
ISOLATION_MODES = tuple(mode.value for mode in Isolation)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def user_cache_dir() -> Path:
    """The platform's per-user cache folder for this plugin (XDG on Linux)."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pytest-compilecache"


@dataclass(frozen=True)
class Options:
    """Every setting of the plugin, as the user gave it."""

    isolation: Isolation = Isolation.OFF
    bundle: Path | None = None
    bundle_url: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    update: bool = False
    rebuild: bool = False
    explain: bool = False
    max_unused_runs: int = DEFAULT_MAX_UNUSED_RUNS
    remote: str | None = None
    strict: bool = False
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    network_timeout: float = DEFAULT_NETWORK_TIMEOUT
    report: Path | None = None
    home: Path = Path()
    headers_dir: Path = Path()
    #: ``verbosity_compilecache``: how much the plugin says (``None``: auto, pytest's ``-v``/``-q``).
    level: int | None = None
    #: What the user gave that the session goes on without, in words (said once in the summary).
    warnings: tuple[str, ...] = ()
    #: Folders of the plugin's home that could not be written, and what stood in: said only in a run that used it.
    home_notices: tuple[str, ...] = ()

    @property
    def has_bundle(self) -> bool:
        """Whether ``--compile-cache-bundle`` names a bundle (a path or a URL)."""
        return self.bundle is not None or self.bundle_url is not None

    @property
    def bundle_name(self) -> str | None:
        """The bundle as messages show it: its URL (without credentials, see ``redacted``), or its absolute path."""
        return redacted(self.bundle_url) if self.bundle_url else (str(self.bundle) if self.bundle is not None else None)

    @property
    def session_wide(self) -> bool:
        """Whether compiles outside fixtures are redirected (isolation or a bundle is on)."""
        return self.isolation is not Isolation.OFF or self.has_bundle

    @property
    def active(self) -> bool:
        """Whether anything session-wide was asked for (else only fixtures do work)."""
        return self.session_wide or self.report is not None or self.remote is not None

    @classmethod
    def from_config(cls, config: pytest.Config, early: bool = False) -> "Options":
        """Resolve every option (``early``: from pytest's first parse, before conftests); a bad one is a UsageError."""
        inidir = Path(config.inipath).parent if config.inipath else Path(config.rootpath)

        def getoption(name: str) -> Any:
            return getattr(config.known_args_namespace, name, None) if early else config.getoption(name, None)

        def pick(name: str, env: str | None = None) -> tuple[Any, Path | None]:
            value = getoption(name)
            if value is not None:
                return value, None
            if env and os.environ.get(env):
                return os.environ[env], None
            return config.getini(name) or "", inidir  # pytest < 8 gives [] for an unset string value

        def path(name: str, env: str | None = None) -> Path | None:
            value, base = pick(name, env)
            if not value:
                return None
            try:
                local = file_url_path(str(value))
            except BundleError as exc:
                raise pytest.UsageError(f"{name}: {exc}") from None
            p = Path(local or str(value)).expanduser()
            return (base / p if base is not None and not p.is_absolute() else p).absolute()

        def text(name: str, env: str | None = None) -> str:
            return str(pick(name, env)[0] or "").strip()

        def flag(name: str) -> bool:
            value = pick(name)[0]
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word not in _TRUE + _FALSE:  # a typo would silently mean off
                raise pytest.UsageError(f"{name}: {value!r} is neither on nor off; use true or false")
            return word in _TRUE

        def seconds(name: str, default: float) -> float:
            value = pick(name)[0]
            if value in (None, ""):
                return default
            try:
                number = float(value)
            except ValueError:
                raise pytest.UsageError(f"{name} must be a number of seconds, not {value!r}") from None
            if not 0 <= number < float("inf"):
                raise pytest.UsageError(f"{name} must be a number of seconds, not negative or infinite, got {value!r}")
            return number

        word = text("compile_cache_isolate")
        by_mode = str(config.getini("compile_cache_isolate_mode") or "").strip()
        if word and by_mode and word != by_mode and getoption("compile_cache_isolate") is None:
            raise pytest.UsageError(f"compile_cache_isolate is {word!r} but compile_cache_isolate_mode is "
                                    f"{by_mode!r}: they are one setting; give one of them")
        setting = "compile_cache_isolate" if word or not by_mode else "compile_cache_isolate_mode"
        word = word or by_mode or "off"
        if word not in ISOLATION_MODES:
            raise pytest.UsageError(f"{setting}: {word!r} is not an isolation mode; use off, test or worker (off: no "
                                    "isolation; test: an empty cache per test; worker: a kept cache per xdist worker)")
        lock_timeout = seconds("compile_cache_lock_timeout", DEFAULT_LOCK_TIMEOUT)
        network_timeout = seconds("compile_cache_network_timeout", DEFAULT_NETWORK_TIMEOUT)
        if network_timeout == 0:
            raise pytest.UsageError("compile_cache_network_timeout must be more than 0 seconds")
        home = path("compile_cache_home") or user_cache_dir()
        unused = str(pick("compile_cache_max_unused_runs")[0] or str(DEFAULT_MAX_UNUSED_RUNS)).strip()
        if not re.fullmatch(r"[0-9]+", unused):
            raise pytest.UsageError(f"compile_cache_max_unused_runs must be a whole number of updating runs "
                                    f"(0: keep everything), not {unused!r}")
        shown = str(config.getini("verbosity_compilecache") or "auto").strip()
        if shown != "auto" and not re.fullmatch(r"-?[0-9]+", shown):
            raise pytest.UsageError(f"verbosity_compilecache must be auto or a whole number (-1: problems only, "
                                    f"0: one line, 1: everything), not {shown!r}")
        rebuild = flag("compile_cache_rebuild")
        remote = text("compile_cache_remote", REMOTE_ENV) or None
        if remote is not None and check_url(remote):
            raise pytest.UsageError(f"compile_cache_remote: {check_url(remote)}")
        named = text("compile_cache_bundle", BUNDLE_ENV)
        warnings: list[str] = []
        given = getoption("compile_cache_bundle")
        if given is not None and not str(given).strip():
            empty = "--compile-cache-bundle was given an empty value (an unset variable?)"
            if flag("compile_cache_strict"):
                raise pytest.UsageError(f"{empty}, and --compile-cache-strict asks for a bundle: name one, or "
                                        "leave the option out")
            warnings.append(f"{empty}: this run has no bundle")
        url = named if is_url(named) else None
        from_env = os.environ.get(STORAGE_OPTIONS_ENV, "")
        where, raw = ((STORAGE_OPTIONS_ENV, from_env) if from_env.strip() else
                      ("compile_cache_storage_options", str(config.getini("compile_cache_storage_options") or "")))
        try:
            storage_options = parse_storage_options(raw)
        except ValueError as exc:
            raise pytest.UsageError(f"{where} {exc}") from None
        bundle = None if url else path("compile_cache_bundle", BUNDLE_ENV)
        report = path("compile_cache_report")
        for name, given, form in (("bundle", bundle, "PATH"), ("report", report, "FILE")):
            if given is not None and given.is_dir():
                hint = (f"; on the command line, give the {name} as --compile-cache-{name}={form} (an option's "
                        "value placed before a path takes the path as its value)"
                        if f"--compile-cache-{name}" in config.invocation_params.args else "")
                raise pytest.UsageError(f"--compile-cache-{name}: {given} is a folder, not a file{hint}")
        update = flag("compile_cache_update")
        if (update or rebuild) and not named:
            option = "--compile-cache-rebuild" if rebuild else "--compile-cache-update"
            raise pytest.UsageError(f"{option} (or {option[2:].replace('-', '_')} in the ini file) changes the bundle "
                                    "named by --compile-cache-bundle, and none is named")
        if path("compile_cache_expect") is not None or flag("compile_cache_expect_update"):
            warnings.append("--compile-cache-expect: compile expectations were removed and the option is "
                            "ignored; assert a test's counts with cold_cache.assert_compiles(...) (docs/fixtures.md)")
        return cls(isolation=Isolation(word), bundle=bundle, bundle_url=url, storage_options=storage_options,
                   update=update or rebuild, rebuild=rebuild, explain=flag("compile_cache_explain"),
                   max_unused_runs=int(unused), remote=remote, strict=flag("compile_cache_strict"),
                   lock_timeout=lock_timeout, network_timeout=network_timeout, report=report, home=home,
                   warnings=tuple(warnings),
                   level=None if shown == "auto" else int(shown),
                   headers_dir=path("compile_cache_headers_dir") or home / "precompiled-headers")


def verbosity(config: pytest.Config, options: Options) -> int:
    """How much the plugin says: ``verbosity_compilecache`` in the ini file, else pytest's ``-v``/``-q`` count;
    ``--compile-cache-explain`` asks for at least ``1``."""
    level = int(config.option.verbose) if options.level is None else options.level
    return max(level, 1) if options.explain else level


def add_options(parser: pytest.Parser) -> None:
    """Register every command-line option and ini value, all under the ``compile-cache`` prefix."""
    group = parser.getgroup("compilecache", "torch.compile cache isolation and bundles (pytest-compilecache)")
    given = [*sys.argv[1:], *os.environ.get("PYTEST_ADDOPTS", "").split()]
    modes = [arg.split("=", 1)[1] for arg in given if arg.startswith("--compile-cache-isolate=")]
    if modes:  # shown beside argparse's "ignored explicit argument"
        parser.extra_info["compilecache"] = (f"--compile-cache-isolate is a bare flag and takes no value; give a "
                                             f"mode as --compile-cache-isolate-mode={modes[0]}")

    def option(name: str, help: str, **kwargs: Any) -> None:
        dest = name.replace("-", "_")
        group.addoption(f"--{name}", dest=dest, default=None, help=f"{help} (ini: {dest})", **kwargs)
        on_off = " (true or false)" if kwargs.get("action") == "store_true" else ""
        # "string", not "bool": pytest's own check of a bool ini value names no option ("invalid truth value")
        parser.addini(dest, help=help + on_off, type="string")

    group.addoption("--compile-cache-isolate", dest="compile_cache_isolate", action="store_const", const="test",
                    default=None, help="give every test its own empty compile cache (the same as "
                                       "--compile-cache-isolate-mode=test; a bare flag: a mode is given with "
                                       "--compile-cache-isolate-mode=MODE)")
    group.addoption("--compile-cache-isolate-mode", dest="compile_cache_isolate", metavar="MODE", default=None,
                    choices=ISOLATION_MODES,
                    help="isolate compile caches: off, test or worker (off: tests share one cache; test: every "
                         "test gets its own empty cache; worker: each process or xdist worker gets its own cache, "
                         "kept between runs) (ini: compile_cache_isolate_mode, or compile_cache_isolate)")
    parser.addini("compile_cache_isolate", type="string",
                  help="isolation mode: off, test or worker (see --compile-cache-isolate-mode)")
    parser.addini("compile_cache_isolate_mode", type="string",
                  help="the same setting as compile_cache_isolate, under the mode option's name")
    option("compile-cache-bundle", f"bundle of compiled artifacts (torch's Mega-Cache: FX graphs, AOTAutograd, "
           f"autotuning, PGO, with C++ and Triton kernels) to load at session start and save at the end: a path, "
           f"or a URL (s3://, gs://, az://, http(s):// read-only, memory://; needs the plugin's extra for "
           f"the store, as [s3]) (env: {BUNDLE_ENV}; an ini path is relative to the ini file)", metavar="PATH|URL")
    option("compile-cache-update", "merge this session's artifacts into an existing bundle", action="store_true")
    option("compile-cache-rebuild", "ignore what the bundle at PATH holds for this machine and write a fresh "
           "entry for it (other machines' entries are kept)", action="store_true")
    option("compile-cache-explain", "explain every FX graph and AOTAutograd miss in every cold_cache and "
           "warm_cache test (warm_cache always explains its misses)", action="store_true")
    option("compile-cache-remote", f"turn on torch's remote (Redis) FX graph, AOTAutograd and autotune "
           f"caches at URL for this session, check that the server answers, and count remote lookups "
           f"(env: {REMOTE_ENV}; needs the plugin's [redis] extra)", metavar="redis://HOST:PORT[/DB]")
    option("compile-cache-strict", "fail the session when the bundle cannot be loaded, warmed up or saved",
           action="store_true")
    option("compile-cache-lock-timeout", "seconds to wait for the bundle lock (default 900)", metavar="SECONDS")
    option("compile-cache-network-timeout", f"seconds a bundle's store may take to answer a request, plus the "
           f"time a transfer takes at {MIN_RATE // 1000} kB/s; past it the session goes on without the store "
           f"(default {DEFAULT_NETWORK_TIMEOUT:g})", metavar="SECONDS")
    option("compile-cache-report", "write per-test and total cache counts as JSON to FILE", metavar="FILE")
    option("compile-cache-expect", "removed: ignored, with a warning", metavar="PATH")
    option("compile-cache-expect-update", "removed: ignored, with a warning", action="store_true")
    parser.addini("compile_cache_storage_options", type="string", help="a JSON object of fsspec options for a bundle "
                  'URL, e.g. {"endpoint_url": "http://127.0.0.1:9000"} (credentials come from the environment; '
                  f"env: {STORAGE_OPTIONS_ENV})")
    parser.addini("compile_cache_max_unused_runs", type="string", help="with --compile-cache-update: drop artifacts "
                  "that none of the last N updating runs of the whole suite used (default "
                  f"{DEFAULT_MAX_UNUSED_RUNS}; 0: keep everything)")
    parser.addini("verbosity_compilecache", type="string", default="auto",
                  help="how much the compilecache summary and header say: -1 problems only, 0 one line, 1 everything "
                       "(default auto: pytest's -q/-v)")
    parser.addini("compile_cache_home", type="string", help="per-user folder for precompiled C++ headers and "
                  "per-worker caches (default: the platform's user cache folder, e.g. ~/.cache/pytest-compilecache)")
    parser.addini("compile_cache_headers_dir", type="string", help="folder for precompiled C++ headers, shared by "
                  "all tests and runs (default: <compile_cache_home>/precompiled-headers)")
