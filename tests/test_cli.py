"""The bundle command line, through its installed entry point, on bundles the tests build."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import pytest

from pytest_compilecache.bundle import signing
from pytest_compilecache.bundle.binaries import CarriedFile
from pytest_compilecache.bundle.format import Bundle, Entry, make_entry, read_manifest
from pytest_compilecache.bundle.writing import write_bundle
from pytest_compilecache.cli import main

#: Real sessions against real servers and suites: left out of the fast tier (-m "not slow").
pytestmark = pytest.mark.slow

CLI = shutil.which("pytest-compilecache", path=str(Path(sys.executable).parent)) or "pytest-compilecache"


class Sessions:
    """How this module runs pytest sessions and the CLI in processes of their own: with a plugin home
    of their own (the ini value ``compile_cache_home``) and the suite's shared precompiled headers, and
    with HOME and XDG_CACHE_HOME pointed at ``user_home``, a folder that stands for the developer's home
    and must stay empty (item 14 of issue 20: the bundle builders filled ~/.cache/pytest-compilecache).
    Sessions are forked from the zygote (``run_session``): torch reads HOME and XDG_CACHE_HOME only when
    it asks for a path, so a fork sees them as a fresh process would."""

    def __init__(self, home: Path, headers: Path, user_home: Path,
                 run_session: Callable[..., subprocess.CompletedProcess[str]]) -> None:
        self.run_session = run_session
        self.home = home
        self.headers = headers
        self.user_home = user_home

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(HOME=str(self.user_home), XDG_CACHE_HOME=str(self.user_home / ".cache"))
        return env

    def args(self) -> list[str]:
        """The options that give a session its plugin home and headers."""
        return ["-o", f"compile_cache_home={self.home}", "-o", f"compile_cache_headers_dir={self.headers}"]

    def run(self, cwd: Path, *args: str, env: dict[str, str] | None = None,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        """``pytest ARGS`` in ``cwd`` (without the cache provider)."""
        command = ["-p", "no:cacheprovider", *self.args(), *args]
        done = self.run_session(command, cwd, self.env(env), 300)
        if check:
            done.check_returncode()
        return done


def written_into(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory, shared_headers_dir: Path,
             run_session: Callable[..., subprocess.CompletedProcess[str]]) -> Iterator[Sessions]:
    """The module's way to run processes; after its last test, the stand-in user home must still be empty."""
    made = Sessions(tmp_path_factory.mktemp("plugin-home"), shared_headers_dir, tmp_path_factory.mktemp("user-home"),
                    run_session)
    yield made
    assert written_into(made.user_home) == [], "a session of this module wrote into the user's home"


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI's ``main`` in this process (as the entry point calls it), output captured, with the
    signing key of ``env`` (as :func:`with_key` makes it) while it runs."""
    before = os.environ.get(signing.KEY_ENV)
    if env is not None:
        os.environ.pop(signing.KEY_ENV, None)
        if signing.KEY_ENV in env:
            os.environ[signing.KEY_ENV] = env[signing.KEY_ENV]
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.environ.pop(signing.KEY_ENV, None)
        if before is not None:
            os.environ[signing.KEY_ENV] = before
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_user_error(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory: pytest.TempPathFactory, sessions: Sessions) -> Path:
    """A real bundle for this machine, made by a pytest run that compiles two small functions."""
    project = tmp_path_factory.mktemp("project")
    (project / "test_make.py").write_text(
        "import torch\n\ndef test_make():\n"
        "    torch.compile(lambda x: x.sin() + 1)(torch.randn(8))\n"
        "    torch.compile(lambda x: x.cos() * 2)(torch.randn(8))\n"
    )
    bundle = project / "good.bundle"
    sessions.run(project, "-q", f"--compile-cache-bundle={bundle}", check=True)
    return bundle


@pytest.fixture
def foreign_bundle(tmp_path: Path) -> Path:
    path = tmp_path / "foreign.bundle"
    env = {"torch": "2.11.0+cu130", "device": "NVIDIA H200", "cuda": "13.0"}
    write_bundle(Bundle(path, [make_entry(env, b"kernels of another machine", {"inductor": {"count": 1, "bytes": 26}})]))
    return path


@pytest.mark.compat
def test_inspect_shows_environments_and_layers(good_bundle: Path, foreign_bundle: Path, tmp_path: Path) -> None:
    result = cli("inspect", good_bundle)
    assert result.returncode == 0, result.stderr
    assert "matches this machine" in result.stdout
    # A newcomer: the sizes listed summed to more than the file ("0.41 MB"), "payload 322430 bytes"
    # beside "155,296 bytes", "1 artifacts", and "inductor" where the summary's table says fx_graph.
    size = good_bundle.stat().st_size
    assert f"bundle format 2, {size:,d} bytes on disk (the sizes below unpacked), 1 environment" in result.stdout, \
        result.stdout
    lines = result.stdout.splitlines()
    assert any(line.strip().startswith("fx_graph (inductor)") and " 2 artifacts " in line for line in lines), lines
    assert any(line.strip().startswith("aot_autograd") and " artifacts " in line for line in lines), lines
    stored = next(line for line in lines if "artifacts " in line and "stored one by one" in line)
    assert re.search(r"artifacts \d{1,3}(,\d{3})+ bytes stored one by one", stored), stored
    data = json.loads(cli("inspect", good_bundle, "--json").stdout)
    entry = data["entries"][0]
    assert entry["matches_here"] is True and entry["differences"] == []
    assert entry["artifacts"]["inductor"]["count"] == 2
    foreign = json.loads(cli("inspect", foreign_bundle, "--json").stdout)["entries"][0]
    assert foreign["matches_here"] is False
    assert any(d.startswith("device: bundle NVIDIA H200, here") for d in foreign["differences"])


@pytest.mark.compat
def test_verify_is_a_ci_gate(good_bundle: Path, foreign_bundle: Path, tmp_path: Path,
                             kernels_name_their_folder: bool) -> None:
    ok = cli("verify", good_bundle)
    assert ok.returncode == 0 and "OK" in ok.stdout
    assert_user_error(cli("verify", foreign_bundle), 1, str(foreign_bundle), "no entry matches this machine", "device")
    with read_manifest(good_bundle) as bundle:
        entry = bundle.entries[0]
        payload_at = bundle._start + entry.offset
        binaries = entry.binaries_section
    damaged = [("payload", payload_at + 5, "fails its checksum")]
    if binaries is None and kernels_name_their_folder:
        assert "fit this machine" not in ok.stdout  # torch 2.7: nothing carried, nothing claimed
    else:
        assert binaries is not None and binaries["files"], "the bundle carries the C++ binaries its test built"
        assert "fit this machine" in ok.stdout
        damaged.append(("binaries", bundle._start + binaries["offset"] + 5, "binaries for"))
    for name, at, message in damaged:
        corrupt = tmp_path / f"corrupt-{name}.bundle"
        data = bytearray(good_bundle.read_bytes())
        data[at] ^= 0xFF
        corrupt.write_bytes(bytes(data))
        assert_user_error(cli("verify", corrupt), 1, str(corrupt), message)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert_user_error(cli("verify", text), 1, str(text), "not a pytest-compilecache bundle")
    assert_user_error(cli("verify", tmp_path / "missing.bundle"), 1, "missing.bundle", "no such file")


def adopted(source: Path, change: Callable[[Entry], Entry] | None = None) -> list[Entry]:
    """The entries of ``source``, read whole, to write into another bundle (``change`` may replace each)."""
    with read_manifest(source) as bundle:
        bundle.read_all()
        made = [make_entry(e.env, bundle.payload(e), e.artifacts, e.created, bundle.carried(e)[0])
                for e in bundle.entries]
    return [change(e) for e in made] if change else made


def test_verify_fails_carried_binaries_that_do_not_match_their_checksum(good_bundle: Path, tmp_path: Path) -> None:
    """Item 8 of issue 20: carried binaries that fail their checksum fail ``verify`` (exit 1, one line on stderr);
    ``inspect`` lists the bundle without reading past the manifest."""
    def break_first(entry: Entry) -> Entry:
        assert entry.binaries, "the bundle carries the C++ binaries its test built"
        first = sorted(key for key in entry.binaries.files if key[1].endswith(".so"))[0]
        garbage = b"\x7fELF but not a shared object " * 64
        entry.binaries.files[first] = replace(CarriedFile.made(*first, garbage),
                                              sha256=entry.binaries.files[first].sha256)
        return make_entry(entry.env, entry.payload or b"", entry.artifacts, entry.created, entry.binaries)

    tampered = tmp_path / "tampered.bundle"
    write_bundle(Bundle(tampered, adopted(good_bundle, break_first)))
    assert_user_error(cli("verify", tampered), 1, str(tampered), "fails its checksum")
    assert cli("inspect", tampered).returncode == 0, "inspect reads nothing past the manifest"


@pytest.mark.compat
def test_merge_and_prune(good_bundle: Path, foreign_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "merged.bundle"
    result = cli("merge", good_bundle, foreign_bundle, good_bundle, "-o", out)
    assert result.returncode == 0, result.stderr
    merged = read_manifest(out)
    assert len(merged.entries) == 2
    mine = next(e for e in merged.entries if e.env == read_manifest(good_bundle).entries[0].env)
    assert mine.artifacts == read_manifest(good_bundle).entries[0].artifacts, "a union of a bundle with itself"
    assert cli("verify", out).returncode == 0

    dropped = cli("prune", out, "--drop", "device=NVIDIA H200")
    assert dropped.returncode == 0, dropped.stderr
    assert len(read_manifest(out).entries) == 1
    shutil.copy(foreign_bundle, tmp_path / "again.bundle")
    cli("merge", out, tmp_path / "again.bundle", "-o", out)
    kept = cli("prune", out, "--keep-matching")
    assert kept.returncode == 0 and "kept 1 of 2" in kept.stdout
    assert cli("verify", out).returncode == 0


def test_merge_errors_leave_no_output(good_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "never.bundle"
    assert_user_error(cli("merge", good_bundle, tmp_path / "nope.bundle", "-o", out), 2, "nope.bundle", "no such file")
    assert not out.exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_user_error(cli("merge", good_bundle, "-o", blocker / "out.bundle"), 2, "is not a folder")
    assert list(tmp_path.iterdir()) == [blocker]
    assert_user_error(cli("prune", good_bundle), 2,
                      "--keep-matching, --drop ENTRY, --max-unused-runs N or --max-size SIZE")


def two_foreign_entries(path: Path) -> Path:
    """A bundle of two made-up entries (no torch needed): entry 0 on an H200, entry 1 on an A100."""
    made = [make_entry({"torch": "2.11.0+cu130", "device": device, "cuda": "13.0"}, device.encode(),
                       {"inductor": {"count": 1, "bytes": len(device)}}) for device in ("NVIDIA H200", "NVIDIA A100")]
    write_bundle(Bundle(path, made))
    return path


def test_prune_refuses_a_drop_that_matches_no_entry(tmp_path: Path) -> None:
    """Item 8 of issue 20: ``--drop devcie=cpu`` and ``--drop 5`` said "kept 1 of 1" and exited 0.
    Each ``--drop`` must match an entry; one that does not is an error naming the bundle and what was
    wrong, and the bundle is left as it was (the other ``--drop`` options are not applied either)."""
    path = two_foreign_entries(tmp_path / "two.bundle")
    before = path.read_bytes()
    typo = cli("prune", path, "--drop", "devcie=cpu")
    assert_user_error(typo, 2, str(path), "'devcie'", "no entry has a field", "cuda, device, torch",
                      f"{path} is unchanged")
    assert "kept" not in typo.stdout
    number = cli("prune", path, "--drop", "5")
    assert_user_error(number, 2, str(path), "no entry 5", "numbered 0 to 1", f"{path} is unchanged")
    value = cli("prune", path, "--drop", "device=cpu")
    assert_user_error(value, 2, str(path), "no entry has device='cpu'", "'NVIDIA A100', 'NVIDIA H200'")
    mixed = cli("prune", path, "--drop", "0", "--drop", "device=cpu")
    assert_user_error(mixed, 2, str(path), "device='cpu'")
    assert_user_error(cli("prune", path, "--drop", "gpu"), 2, "'gpu'", "FIELD=VALUE")
    assert path.read_bytes() == before
    both = cli("prune", path, "--drop", "0", "--drop", "device=NVIDIA H200")
    assert both.returncode == 0 and "kept 1 of 2" in both.stdout, both.stderr
    assert [e.env["device"] for e in read_manifest(path).entries] == ["NVIDIA A100"]


def test_help_is_plain_text_and_says_what_each_argument_does() -> None:
    """Item 8 of issue 20: ``--help`` showed reST markup (double backticks), ``merge``'s inputs and
    ``-o`` had no help, and ``prune`` was "remove environments" although ``--max-size`` drops artifacts."""
    import argparse

    from pytest_compilecache.cli import parser

    top = parser()
    (commands,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in [("", top), *commands.choices.items()]:
        shown = cli(*([name] if name else []), "--help")
        assert shown.returncode == 0 and shown.stdout, shown.stderr
        for markup in ("`", ":class:", ":func:", ":data:", "**"):
            assert markup not in shown.stdout, f"pytest-compilecache {name} --help shows {markup!r}:\n{shown.stdout}"
        for action in command._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help and action.help != argparse.SUPPRESS, f"{name}: {action.dest} has no help"
    for action in commands._choices_actions:
        assert action.help, f"{action.dest} has no help"
    prune = cli("prune", "--help").stdout
    assert "remove environments" not in prune
    assert "least recently used artifacts" in prune and "drop entry" in prune and "except this machine's" in prune
    merge = cli("merge", "--help").stdout
    assert "replaced unless it is also an input" in merge, merge


def test_version_prints_the_installed_version() -> None:
    """Item 9 of issue 56: ``pytest-compilecache --version`` was a usage error."""
    from importlib import metadata

    shown = subprocess.run([CLI, "--version"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"pytest-compilecache {metadata.version('pytest-compilecache')}\n"


def test_the_only_file_beside_a_bundle_is_its_hidden_lock(good_bundle: Path, tmp_path: Path) -> None:
    """Item 8 of issue 20: an empty ``PATH.lock`` was left beside every bundle a session or a command
    wrote. The lock (filelock's, which leaves its file) is ``.NAME.lock``, hidden; nothing else is left."""
    assert not Path(f"{good_bundle}.lock").exists(), "no visible lock file beside the bundle"
    out = tmp_path / "out.bundle"
    assert cli("merge", good_bundle, "-o", out).returncode == 0
    assert cli("prune", out, "--max-size", "1GB").returncode == 0
    assert_user_error(cli("prune", out, "--drop", "7"), 2, "no entry 7")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.bundle.lock", "out.bundle"]


def test_nothing_is_written_into_the_users_home(good_bundle: Path, sessions: Sessions) -> None:
    """Item 14 of issue 20: this module's bundle builder (and every session it runs) gets a plugin home of
    its own; HOME and XDG_CACHE_HOME point at a stand-in for the developer's home, which stays empty."""
    assert good_bundle.is_file()
    assert written_into(sessions.user_home) == [], "the bundle builder wrote into the user's home"


def test_python_m_runs_the_same_command_and_says_nothing_of_torch_where_numpy_is_missing(
        good_bundle: Path, tmp_path: Path, sessions: Sessions) -> None:
    """``python -m pytest_compilecache`` runs the same command line. A newcomer's ``inspect`` and ``verify``
    printed torch's "Failed to initialize NumPy" warning on stderr in every call (a CPU torch installs no
    numpy); it says nothing about bundles."""
    stub = tmp_path / "no-numpy"
    stub.mkdir()
    (stub / "numpy.py").write_text('raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n')
    env = sessions.env()
    env["PYTHONPATH"] = os.pathsep.join([str(stub), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-m", "pytest_compilecache", "verify", str(good_bundle)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # inspect imports torch the same way


H200_BUNDLE = Path(__file__).parent / "data" / "h200-torch2.11.bundle"


def test_a_real_gpu_bundle_does_not_match_a_cpu_machine(tmp_path: Path) -> None:
    """A bundle made on an H200 (torch 2.11, Triton 3.6) names the fields that differ here."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the check is for CPU machines")
    result = cli("verify", H200_BUNDLE)
    assert_user_error(result, 1, "no entry matches this machine", "device: bundle NVIDIA H200, here cpu",
                      "triton: bundle 3.6.0", "cuda: bundle 13.0")
    entry = json.loads(cli("inspect", H200_BUNDLE, "--json").stdout)["entries"][0]
    assert entry["artifacts"]["autotune"]["count"] == 1


def test_a_real_gpu_bundle_is_not_loaded_on_a_cpu_machine(tmp_path: Path, sessions: Sessions) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the check is for CPU machines")
    bundle = tmp_path / "gpu.bundle"
    shutil.copy(H200_BUNDLE, bundle)
    (tmp_path / "test_gpu_bundle.py").write_text("def test_w(warm_cache):\n    pass\n")
    done = sessions.run(tmp_path, f"--compile-cache-bundle={bundle}", "-rs", f"--basetemp={tmp_path / 'base'}")
    result = pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(), 0.0)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*bundle: incompatible:*no entry matches this machine*device: bundle NVIDIA H200, here cpu*"])
    assert bundle.read_bytes() == H200_BUNDLE.read_bytes()


def rekeyed(payload: bytes, kind: str, key: str) -> bytes:
    """Mega-Cache bytes with the first artifact of ``kind`` under another key (what a crafted bundle holds)."""
    import dataclasses

    from torch.compiler._cache import _serialize_single_cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    from pytest_compilecache._torchapi import megacache

    artifacts = megacache._deserialize(payload)
    artifacts[kind][0] = dataclasses.replace(artifacts[kind][0], key=key)
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend((k, list(v)) for k, v in artifacts.items() if v)
    return bytes(serializer.to_bytes())


def test_a_key_that_leaves_the_cache_folder_is_never_loaded(good_bundle: Path, tmp_path: Path,
                                                            sessions: Sessions) -> None:
    pytest.importorskip("torch")
    with read_manifest(good_bundle) as bundle:
        bundle.read_all()
    entry = bundle.entries[0]
    crafted = tmp_path / "project" / "crafted.bundle"
    bad = rekeyed(bundle.payload(entry), "inductor", "../../../../escaped")
    write_bundle(Bundle(crafted, [make_entry(entry.env, bad, entry.artifacts, entry.created)]))
    assert_user_error(cli("verify", crafted), 1, str(crafted), "'../../../../escaped'", "outside the cache folder")

    project = crafted.parent
    (project / "test_uses_it.py").write_text(
        "import torch\n\ndef test_warm(warm_cache):\n    torch.compile(lambda x: x.sin() + 1)(torch.randn(8))\n"
    )
    done = sessions.run(project, "-q", "-rs", "-p", "no:randomly", f"--compile-cache-bundle={crafted}",
                        f"--basetemp={project / 'base'}")
    assert "could write outside the cache folder" in done.stdout and str(crafted) in done.stdout, done.stdout
    assert not list(tmp_path.rglob("escaped*")), "a byte was written outside the cache folder"


def with_key(secret: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_COMPILE_CACHE_KEY"}
    if secret is not None:
        env["PYTEST_COMPILE_CACHE_KEY"] = secret
    return env


def cli_env(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return cli(*args, env=env)


def rewrite_manifest(source: Path, target: Path, change: Callable[[dict], None]) -> None:
    """Copy a bundle with its manifest JSON changed and every byte after it kept."""
    data = source.read_bytes()
    magic, length, rest = data.split(b"\n", 2)
    manifest = json.loads(rest[:int(length)])
    change(manifest)
    new = json.dumps(manifest).encode()
    target.write_bytes(magic + b"\n" + b"%d\n" % len(new) + new + rest[int(length):])


def test_signed_bundles(good_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sessions: Sessions) -> None:
    """With PYTEST_COMPILE_CACHE_KEY set, only entries signed with it are used, in sessions and in verify."""
    signed = tmp_path / "project" / "signed.bundle"
    monkeypatch.setenv("PYTEST_COMPILE_CACHE_KEY", "right")
    with read_manifest(good_bundle) as bundle:
        bundle.read_all()
    adopted = [make_entry(e.env, bundle.payload(e), e.artifacts, e.created, bundle.carried(e)[0]) for e in bundle.entries]
    write_bundle(Bundle(signed, adopted))
    monkeypatch.delenv("PYTEST_COMPILE_CACHE_KEY")
    assert read_manifest(signed).entries[0].signature, "a bundle written with the key set is signed"
    assert "PYTEST_COMPILE_CACHE_KEY" not in signed.read_bytes().decode(errors="replace")
    assert b"right" not in signed.read_bytes()[:200_000]

    ok = cli_env(with_key("right"), "verify", signed)
    assert ok.returncode == 0 and "OK" in ok.stdout, ok.stderr
    assert "signed; valid" in cli_env(with_key("right"), "inspect", signed).stdout
    assert "not checked" in cli_env(with_key(None), "inspect", signed).stdout
    assert_user_error(cli_env(with_key("wrong"), "verify", signed), 1, str(signed), "signature does not match")
    assert_user_error(cli_env(with_key("right"), "verify", good_bundle), 1, str(good_bundle), "unsigned")
    assert cli_env(with_key(None), "verify", good_bundle).returncode == 0, "without the key, as before"

    forged = tmp_path / "project" / "forged.bundle"
    rewrite_manifest(signed, forged, lambda m: m["entries"][0]["history"].update(tests={"x": 1.0}))
    assert_user_error(cli_env(with_key("right"), "verify", forged), 1, str(forged), "signature does not match")

    project = signed.parent
    (project / "test_uses_it.py").write_text(
        "import torch\n\ndef test_warm(warm_cache):\n    torch.compile(lambda x: x.sin() + 1)(torch.randn(8))\n"
    )

    def session(bundle: Path, secret: str | None, *extra: str) -> subprocess.CompletedProcess[str]:
        return sessions.run(project, "-rs", "-p", "no:randomly", f"--compile-cache-bundle={bundle}",
                            f"--basetemp={project / 'base'}", *extra, env=with_key(secret))

    good = session(signed, "right")
    assert good.returncode == 0 and "bundles are signed and checked with PYTEST_COMPILE_CACHE_KEY" in good.stdout
    assert "bundle: loaded" in good.stdout, good.stdout
    refused = session(forged, "right", "--compile-cache-strict")
    assert refused.returncode != 0, refused.stdout
    said = refused.stdout + refused.stderr
    assert f"{forged}: the entry for" in said and "signature does not match" in said, said
    unsigned = session(good_bundle, "right")
    assert "unsigned (PYTEST_COMPILE_CACHE_KEY is set); it is not used" in unsigned.stdout, unsigned.stdout
    assert "bundles are unsigned" in session(signed, None, "--co").stdout


def test_writing_with_the_key_never_signs_what_it_did_not_verify(
    good_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sessions: Sessions
) -> None:
    """An unsigned (or forged) entry that reaches a write made with the key set (merge, prune, an
    updating session) is never signed: merge refuses it, prune keeps it refused, and an updating
    session drops it instead of merging it into the entry it signs."""
    work = tmp_path / "work"
    work.mkdir()
    unsigned = work / "fork.bundle"
    shutil.copy(good_bundle, unsigned)

    merged = cli_env(with_key("right"), "merge", unsigned, "-o", work / "out.bundle")
    assert_user_error(merged, 2, str(unsigned), "unsigned")
    assert not (work / "out.bundle").exists()

    pruned = cli_env(with_key("right"), "prune", unsigned, "--max-size", "1GB")
    assert pruned.returncode == 0 and "kept 1 of 1" in pruned.stdout, pruned.stderr
    assert_user_error(cli_env(with_key("right"), "verify", unsigned), 1, str(unsigned), "unsigned")

    (work / "test_update.py").write_text(
        "import torch\n\ndef test_other():\n    torch.compile(lambda x: x.tan() - 1)(torch.randn(8))\n"
    )
    updated = sessions.run(work, "-p", "no:randomly", "test_update.py", f"--compile-cache-bundle={unsigned}",
                           "--compile-cache-update", f"--basetemp={work / 'base'}", env=with_key("right"))
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert "dropped" in updated.stdout and "unsigned" in updated.stdout, updated.stdout
    assert cli_env(with_key("right"), "verify", unsigned).returncode == 0, "the session's own entry is signed"
    with read_manifest(unsigned) as bundle:
        (entry,) = bundle.entries
        assert entry.artifacts["inductor"]["count"] == 1, "only the session's own graph, not the fork's two"


def test_a_warmup_with_the_key_set_uses_what_it_published(tmp_path: Path, sessions: Sessions) -> None:
    """The process that runs the warmup loads the entry it just signed (no 'unsigned' refusal)."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.hookimpl(optionalhook=True)\ndef pytest_compilecache_warmup(cache):\n"
        "    import torch\n    torch.compile(lambda x: x.sin() + 1)(torch.randn(8))\n"
    )
    (tmp_path / "test_warm.py").write_text(
        "import torch\n\ndef test_warm(warm_cache):\n    torch.compile(lambda x: x.sin() + 1)(torch.randn(8))\n"
        "    warm_cache.assert_hits(fx_graph=1)\n"
    )
    result = sessions.run(tmp_path, "-p", "no:randomly", "--compile-cache-strict",
                          f"--compile-cache-bundle={tmp_path / 'w.bundle'}", f"--basetemp={tmp_path / 'base'}",
                          env=with_key("right"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "unsigned" not in result.stdout, result.stdout


def test_prune_never_leaves_a_bundle_with_nothing_in_it(good_bundle: Path, tmp_path: Path) -> None:
    """A newcomer's ``prune --max-size 10k`` said "kept 1 of 1 environment(s); 212,143 -> 1,097 bytes" and
    wrote a 62-byte bundle with no entry; ``--drop 0`` on the only entry did the same. A prune that would
    leave nothing usable is refused, the bundle unchanged; what a prune reports is what it wrote."""
    path = tmp_path / "p.bundle"
    shutil.copy(good_bundle, path)
    before = path.read_bytes()
    small = cli("prune", path, "--max-size", "10k")
    assert_user_error(small, 2, str(path), "cannot fit in 10,000 bytes", f"{path} is unchanged")
    only = cli("prune", path, "--drop", "0")
    assert_user_error(only, 2, str(path), "no entry would be left", f"{path} is unchanged")
    assert path.read_bytes() == before
    fits = cli("prune", path, "--max-size", "1GB")
    assert fits.returncode == 0 and f"-> {path.stat().st_size:,d} bytes" in fits.stdout, fits.stdout
    # Carried binaries serve FX graph entries: an entry left with binaries and no artifact is nothing
    # usable either (a newcomer's --max-size 100k kept 7 binaries and no artifact).
    pruned = 0
    for limit in range(len(before) // 6, len(before), len(before) // 6):
        shutil.copy(good_bundle, path)
        result = cli("prune", path, "--max-size", str(limit))
        if result.returncode == 0:
            pruned += 1
            with read_manifest(path) as b:
                assert all(entry.artifacts for entry in b.entries), (limit, result.stdout)
        else:
            assert_user_error(result, 2, str(path), f"cannot fit in {limit:,d} bytes", f"{path} is unchanged")
            assert path.read_bytes() == before
    assert pruned, "some limit below the bundle's size keeps an artifact"


def test_prune_to_a_size_says_when_it_drops_what_the_last_run_used(good_bundle: Path, tmp_path: Path,
                                                                  sessions: Sessions) -> None:
    """A newcomer's ``prune --max-size 200kb`` dropped the artifacts a warm test needed, all used in the
    last recorded run, and said only "dropped 3 least recently used artifacts"; the next run failed
    that test with a miss. Among artifacts used equally recently the largest go first (fewest lost),
    and the output says how many of those dropped the last run used, and what follows."""
    from pytest_compilecache.bundle.format import read_manifest

    path = tmp_path / "p.bundle"
    shutil.copy(good_bundle, path)
    sessions.run(good_bundle.parent, "-q", f"--compile-cache-bundle={path}", "--compile-cache-update",
                 f"--basetemp={tmp_path / 'base'}", check=True)
    with read_manifest(path) as bundle:
        (entry,) = bundle.entries
        index, _ = bundle.key_index(entry)
    assert index is not None and index.runs, "the updating run recorded its use of the bundle"
    size = path.stat().st_size
    result = cli("prune", path, "--max-size", str(size - 2000))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "least recently used" in line]
    assert lines and "the last recorded run used" in lines[0], result.stdout
    assert re.search(r"least recently used artifacts? \(\d+ aot_autograd", lines[0]), "which layers lost them"
    assert "tests that need them miss until an updating run saves them again" in lines[0], result.stdout
    with read_manifest(path) as bundle:
        (entry,) = bundle.entries
        kinds = {kind: counts["count"] for kind, counts in entry.artifacts.items()}
    # An AOTAutograd entry goes before the FX graph it names: alone, the graph still serves a compile.
    assert kinds.get("inductor") == 2 and kinds.get("aot_autograd", 0) < 2, kinds
    # The miss that follows is explained as the prune's, not as new code (a newcomer's read).
    after = sessions.run(good_bundle.parent, "-q", f"--compile-cache-bundle={path}", "--compile-cache-explain",
                         f"--basetemp={tmp_path / 'base2'}", check=True)
    said = [line.strip() for line in after.stdout.splitlines() if "AOTAutograd miss in" in line]
    assert said and all("`prune --max-size` dropped it" in line and "new code" not in line for line in said), \
        after.stdout


def test_a_mistyped_option_after_a_command_shows_that_commands_usage(good_bundle: Path) -> None:
    """A newcomer's ``prune PATH --max-sise 1`` printed the top-level usage ("COMMAND ..."), not prune's."""
    for command, typo in (("prune", "--max-sise"), ("inspect", "--bogus"), ("verify", "--jsn"), ("prune", "--max-siz"),
                          ("inspect", "--js")):
        result = cli(command, good_bundle, typo, "1")
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr.startswith(f"usage: pytest-compilecache {command} "), result.stderr
        assert f"pytest-compilecache {command}: error: unrecognized arguments: {typo} 1" in result.stderr, result.stderr


def test_output_into_a_closed_pipe_ends_quietly(good_bundle: Path, sessions: Sessions) -> None:
    """``inspect PATH | head -3`` printed a BrokenPipeError traceback once head had its lines (here the
    reader is gone before the first line, so that every write fails, as the last ones did)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([CLI, "inspect", str(good_bundle)], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=300, env=sessions.env())
    finally:
        os.close(write)
    assert done.stderr == "", done.stderr
    assert done.returncode == 1, done.returncode


def test_no_command_lists_the_commands() -> None:
    """A newcomer's bare ``pytest-compilecache`` said only that COMMAND is required."""
    done = cli()
    assert done.returncode == 2
    assert "the following arguments are required: {inspect,verify,merge,prune}" in done.stderr, done.stderr
