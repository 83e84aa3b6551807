"""The container image's recipe (deploy/Dockerfile), run without a container engine: the same
commands, in the same order, as the image's user, against the real broker.

No Docker engine runs where these tests run, so the image is not built here. The test reads
the Dockerfile and replays each stage in a temporary directory:
- **build**: a source tree holding only what the build stage COPYs (a file the image forgets
  fails the build here as it would there), then the stage's `pip wheel` command;
- **runtime**: a fresh virtualenv installed from those wheels alone (`--no-index`), then the
  stage's check command (the kernels import, `grudge-stream --version`) as uid 10001;
- **entrypoint**: ENTRYPOINT + CMD with the image's ENV, as uid 10001 from its WORKDIR (the state
  directory), until the HEALTHCHECK command passes, then SIGTERM, exit 0.

Deviations, stated: GRUDGE_WEB_HOST is 127.0.0.1 instead of the image's 0.0.0.0 (tests listen
on loopback only), and the worker gets a broker, a key and a token file as a deployment would.
The runtime stage's `apt-get install libjemalloc2` is not replayed: the image's LD_PRELOAD
loads this machine's jemalloc where it has one (the worker's /ready must then say
"jemalloc"), and is dropped where it has none ("system").
"""
from __future__ import annotations

import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grudge_devkafka import free_port

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), continuations joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            out.append([])
        out[-1].append((word.upper(), " ".join(rest.split())))
    return out


READY = ("import json, os, urllib.request, urllib.error\n"
         "try:\n"
         "    r = urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ['GRUDGE_WEB_PORT'], timeout=4)\n"
         "except urllib.error.HTTPError as exc:\n"
         "    r = exc\n"
         "print(r.read().decode())")


def preloads(lib: str) -> bool:
    """Whether the dynamic linker here can preload ``lib``."""
    out = subprocess.run([sys.executable, "-c", "pass"], env={"LD_PRELOAD": lib}, capture_output=True, timeout=60)
    return out.returncode == 0 and b"cannot be preloaded" not in out.stderr


def resolve(argv: list[str], env: dict) -> list[str]:
    """``argv`` with its program looked up on the image's PATH, as the image's shell would. The
    absolute path matters here: this machine's Python lives in a directory the image's user
    cannot search, and a venv interpreter started by a bare name then misses its venv."""
    found = shutil.which(argv[0], path=env["PATH"])
    assert found, f"{argv[0]} not on the image's PATH {env['PATH']}"
    return [found, *argv[1:]]


def test_the_recipe_is_what_this_test_replays() -> None:
    build, final = stages()
    assert [w for w, _ in build].count("RUN") == 2 and any("pip wheel" in a for w, a in build if w == "RUN")
    runs = [a for w, a in final if w == "RUN"]
    assert "pip install" in runs[0] and "--no-index" in runs[0] and "grudge-stream --version" in runs[0]
    # jemalloc from the base image's packages, preloaded for every process of the image
    assert any("apt-get install" in a and "libjemalloc2" in a for a in runs[1:])
    assert any(w == "ENV" and "LD_PRELOAD=libjemalloc.so.2" in a.split() for w, a in final)
    assert ("USER", "10001:10001") in final and ("ENTRYPOINT", '["grudge-stream", "worker"]') in final


@pytest.fixture
def work():
    """A directory the image's user may traverse (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="grudge-image-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_the_image_recipe_builds_installs_and_runs_as_its_user(harness, image_user, work) -> None:
    prefix, env, _, state = image_user
    tmp_path = work
    build, final = stages()
    # -- build stage: only what it copies, then its pip wheel command -----------------------------
    src = tmp_path / "src"
    src.mkdir()
    for word, args in build:
        if word == "COPY":
            *sources, dest = shlex.split(args)
            for source in sources:
                target = src / (source if dest in ("./", ".") else dest)
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns(
                        "__pycache__", "*.so", "*.c", "build"))
                else:
                    shutil.copy2(ROOT / source, target)
    (wheel_cmd,) = [a for w, a in build if w == "RUN" and "pip wheel" in a]
    wheels = tmp_path / "wheels"
    cmd = shlex.split(wheel_cmd.replace("/wheels", str(wheels)).replace("--no-cache-dir", ""))
    assert cmd[:2] == ["pip", "wheel"]
    out = subprocess.run([sys.executable, "-m", *cmd], cwd=src, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert list(wheels.glob("grudge_stream-*.whl"))
    # -- runtime stage: a fresh venv from those wheels alone, then its check as the image's user --
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install, *checks = [a for w, a in final if w == "RUN"][0].split(" && ")
    install = install.replace("--mount=type=bind,from=build,source=/wheels,target=/wheels ", "")
    install = install.replace("/wheels/grudge_stream-*.whl", "@WHEEL@").replace("/wheels", str(wheels))
    install = install.replace("@WHEEL@", str(next(wheels.glob("grudge_stream-*.whl")))).replace("--no-cache-dir", "")
    cmd = shlex.split(install)
    assert cmd[:2] == ["pip", "install"] and "--no-index" in cmd
    out = subprocess.run([str(venv / "bin" / "python"), "-m", *cmd], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    image_env = {**env, "PATH": f"{venv / 'bin'}:/usr/bin:/bin"}
    for word, args in final:
        if word == "ENV":
            for pair in shlex.split(args):
                k, _, v = pair.partition("=")
                image_env[k] = v
    assert image_env["GRUDGE_STATE_DIR"] == "/var/lib/grudge-stream"
    # The image's apt-get install is not replayed: jemalloc comes from this machine where it has
    # it, and LD_PRELOAD is dropped where it does not (the worker then says allocator "system").
    jemalloc = preloads(image_env["LD_PRELOAD"])
    if not jemalloc:
        del image_env["LD_PRELOAD"]
    image_env["GRUDGE_STATE_DIR"] = str(state)  # the image's VOLUME, here
    image_env["GRUDGE_WEB_HOST"] = "127.0.0.1"  # the image binds 0.0.0.0; tests stay on loopback
    for check in checks:
        out = subprocess.run(prefix + resolve(shlex.split(check), image_env), env=image_env, cwd=str(state),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (check, out.stdout, out.stderr)
    from importlib.metadata import version

    assert out.stdout.strip() == f"grudge-stream {version('grudge-stream')}"
    # -- ENTRYPOINT + CMD as the image's user, until its HEALTHCHECK passes; SIGTERM exits 0 ------
    h = harness(partitions=2)
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir(mode=0o755)
    (secret_dir / "seed").write_text(h.overrides["seed"])
    (secret_dir / "tokens").write_text(f"worker:{secrets.token_urlsafe(32)}\n")
    port = free_port()
    entry = [a for w, a in final if w == "ENTRYPOINT"][0]
    cmd_default = [a for w, a in final if w == "CMD"][0]
    import json

    argv = json.loads(entry) + json.loads(cmd_default)
    assert argv == ["grudge-stream", "worker", "abuse_scores"]
    sets = {k: v for k, v in h.overrides.items() if k not in ("seed", "bootstrap_servers")}
    run_env = {**image_env, "KAFKA_BOOTSTRAP_SERVERS": h.bootstrap, "GRUDGE_WEB_PORT": str(port),
               "GRUDGE_SEED_FILE": str(secret_dir / "seed"), "GRUDGE_QUERY_TOKEN_FILE": str(secret_dir / "tokens"),
               **{f"GRUDGE_{k.upper()}": v for k, v in sets.items()}}
    log_path = tmp_path / "entrypoint.log"
    with open(log_path, "wb") as f:
        proc = subprocess.Popen(prefix + resolve(argv, run_env) + ["--no-create-topics"], env=run_env, cwd=str(state),
                                stdout=f, stderr=subprocess.STDOUT)
    w = h.track(proc, log_path, port)
    (health,) = [a for wd, a in final if wd == "HEALTHCHECK"]
    health_cmd = json.loads(health.split(" CMD ", 1)[1])
    deadline = time.monotonic() + 90
    while True:
        out = subprocess.run(prefix + resolve(health_cmd, run_env), env=run_env, cwd=str(state), capture_output=True,
                             timeout=30)
        if out.returncode == 0:
            break
        assert proc.poll() is None, w.log()[-3000:]
        assert time.monotonic() < deadline, f"HEALTHCHECK never passed: {out.stderr[-500:]!r}; {w.log()[-2000:]}"
        time.sleep(1)
    ready = json.loads(subprocess.run(prefix + resolve(["python", "-c", READY], run_env), env=run_env,
                                      cwd=str(state), capture_output=True, timeout=30).stdout)
    assert ready["allocator"] == ("jemalloc" if jemalloc else "system"), ready
    h.produce(h.make_events(500, seed=3, abusers=2, users=20))
    h.wait_caught_up()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0, w.log()[-3000:]
