"""A virtualenv holding a released grudge-stream, built from its release commit.

    python3 tools/release_venv.py            # .cache/grudge-0.2.0-venv; prints its bin directory

Releases are not on PyPI: the package is built from the release commit's source
(``git archive <commit>``, then ``pip install`` of that tree, which compiles its Cython), so
it is the released package. The venv is kept under the checkout's ``.cache/`` (git-ignored)
and rebuilt only when missing or not holding that version. Exit status 3 when the commit is
not in this repository (a shallow clone): the callers skip then. ``make release-venvs`` and
the upgrade tests (tests/integration/test_upgrade.py) use it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASES = {"0.2.0": "07202d7"}
NO_COMMIT = 3


def venv_dir(version: str) -> Path:
    return ROOT / ".cache" / f"grudge-{version}-venv"


MARKER = "grudge-release-commit"  # in the venv: the commit its package was built from


def installed(version: str) -> bool:
    """The venv exists, holds grudge-stream ``version`` and was built from its release commit
    (the version number alone does not say: the development tree carries it too until the
    next release)."""
    venv = venv_dir(version)
    py = venv / "bin" / "python"
    marker = venv / MARKER
    if not py.exists() or not marker.exists() or marker.read_text().strip() != RELEASES[version]:
        return False
    got = subprocess.run([str(py), "-c", "from importlib.metadata import version; print(version('grudge-stream'))"],
                         capture_output=True, text=True, cwd="/")
    return got.returncode == 0 and got.stdout.strip() == version


def has_commit(commit: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


def build(version: str, python: str = sys.executable, quiet: bool = True) -> Path:
    commit = RELEASES[version]
    venv = venv_dir(version)
    if installed(version):
        return venv / "bin"
    if not has_commit(commit):
        raise LookupError(f"release commit {commit} (grudge-stream {version}) is not in {ROOT} "
                          "(a shallow clone? `git fetch --unshallow`)")
    t0 = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"grudge-{version}-src-") as src:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                                 capture_output=True, check=True).stdout
        tmp_tar = Path(src) / "src.tar"
        tmp_tar.write_bytes(archive)
        with tarfile.open(tmp_tar) as tf:
            # The "data" filter where this Python has it (3.10.12+, 3.11.4+); git's own archive either way.
            kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tf.extractall(Path(src) / "tree", **kw)
        q = ["-q"] if quiet else []
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", *q, str(Path(src) / "tree")],
                       check=True, cwd="/")
    (venv / MARKER).write_text(commit + "\n")
    if not installed(version):
        raise RuntimeError(f"{venv} does not hold grudge-stream {version} after the build")
    print(f"built grudge-stream {version} ({commit}) into {venv} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return venv / "bin"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version", nargs="?", default="0.2.0", choices=sorted(RELEASES))
    ap.add_argument("--python", default=sys.executable, help="the interpreter the venv is made from")
    args = ap.parse_args()
    try:
        print(build(args.version, args.python, quiet=False))
    except LookupError as exc:
        print(f"release_venv: {exc}", file=sys.stderr)
        raise SystemExit(NO_COMMIT) from None


if __name__ == "__main__":
    main()
