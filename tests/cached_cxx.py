"""The test suite's C++ compiler: g++, with its outputs kept for the rest of one test session.

Every inner pytest run starts with empty cache folders (that is what the plugin is for), so torch's
Inductor compiles the same few C++ kernels with g++ again in each of them: about half of a cold
inner run's time. This wrapper, installed as ``CXX`` for the session's subprocesses, keys each
compile by its command line and the bytes of every file it names, and hands back the output of an
identical earlier compile instead of running g++ again. ccache cannot do this: torch compiles and
links in one command. Precompiled headers are kept too: a ``.gch`` copied beside a header of the same
bytes in another folder is one g++ uses (``-H`` marks it ``!``). Commands that are not plain
``... -o OUTPUT`` compiles (``--version``, reading stdin, another language) always run g++. A source that includes a file by absolute path (torch 2.7 includes
its kernels' prefix header from the cache folder) is keyed by that file's bytes, not its path, so the
same kernel compiled in another cache folder is the same compile. What torch sees is a real compiler's real output: its caches
miss and hit exactly as with g++ itself.

Usage: ``cached_cxx.py CACHE_FOLDER COMPILER ARGS...``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile


_ABSOLUTE_INCLUDE = re.compile(rb'#include "(/[^"]+)"')


def _source_digest(data: bytes) -> bytes:
    """The digest of a source file's bytes, each file it includes by absolute path replaced by that file's digest."""
    def included(match: re.Match[bytes]) -> bytes:
        try:
            with open(match.group(1), "rb") as handle:
                return b'#include "sha256:' + hashlib.sha256(handle.read()).hexdigest().encode() + b'"'
        except OSError:
            return match.group(0)

    return hashlib.sha256(_ABSOLUTE_INCLUDE.sub(included, data)).digest()


def key_of(args: list[str], output_index: int) -> str | None:
    """The compile's key, or None where it must not be cached."""
    language = args[args.index("-x") + 1] if "-x" in args[:-1] else None
    if "-" in args or language not in (None, "c++-header"):
        return None
    digest = hashlib.sha256()
    for index, arg in enumerate(args):
        if index == output_index:
            digest.update(b"\0OUT" + os.path.splitext(arg)[1].encode())
        elif os.path.isfile(arg):
            with open(arg, "rb") as handle:
                digest.update(b"\0FILE" + _source_digest(handle.read()))
        else:
            digest.update(b"\0ARG" + arg.encode())
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    folder, compiler, args = argv[0], argv[1], argv[2:]
    output_index = args.index("-o") + 1 if "-o" in args and args.index("-o") + 1 < len(args) else -1
    key = key_of(args, output_index) if output_index > 0 else None
    if key is None:
        return subprocess.call([compiler, *args])
    kept = os.path.join(folder, key)
    output = args[output_index]
    if os.path.isfile(kept):  # a new file at the output's path, as the linker makes one
        handle, partial = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(output)))
        os.close(handle)
        shutil.copyfile(kept, partial)  # a new file's time, as a build gives it
        shutil.copymode(kept, partial)
        os.replace(partial, output)
        return 0
    code = subprocess.call([compiler, *args])
    if code == 0 and os.path.isfile(output):
        os.makedirs(folder, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=folder)
        os.close(handle)
        shutil.copy2(output, partial)
        os.replace(partial, kept)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
