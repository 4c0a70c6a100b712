"""deploy/image/Dockerfile, read as text: it cannot be built here (no container engine).

What it installs is exercised by test_wheel.py; these check the rest of what the issue asks.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            word, _, rest = stripped.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage, in order."""
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def test_the_base_is_a_build_argument_without_a_floating_default():
    """Every stage starts from PYTHON_IMAGE, which has no default tag to drift to."""
    args = [rest for word, rest in instructions() if word == "ARG"]
    assert "PYTHON_IMAGE" in args  # declared, no `=default`
    froms = [rest.split()[0] for word, rest in instructions() if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert "@sha256:<digest>" in DOCKERFILE.read_text(encoding="utf-8")


def test_the_build_stage_installs_the_lock_with_hashes_and_wheels_only():
    """Dependencies come from requirements/runtime.txt, hash-checked, no source builds."""
    build, _ = stages()
    runs = " ".join(rest for word, rest in build if word == "RUN")
    assert "--require-hashes" in runs
    assert "--only-binary=:all:" in runs
    assert "-r requirements/runtime.txt" in runs
    assert "--no-deps dist/pipeline-" in runs


def test_the_final_stage_runs_pipeline_as_the_manifests_user_without_compilers():
    """Non-root numeric user equal to the manifests' runAsUser, `pipeline` entry point."""
    _, final = stages()
    words = [word for word, _ in final]
    (user,) = [rest for word, rest in final if word == "USER"]
    uid = int(user.split(":")[0])
    assert uid != 0
    assert words.index("USER") > max(i for i, w in enumerate(words) if w in {"RUN", "COPY"})
    (entry,) = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert yaml.safe_load(entry) == ["pipeline"]
    runs = " ".join(rest for word, rest in final if word == "RUN")
    for tool in ("apt-get", "gcc", "build-essential", "pip install"):
        assert tool not in runs
    manifest = (ROOT / "deploy/k8s/base/consumers/messages.yaml").read_text(encoding="utf-8")
    deployment = next(yaml.safe_load_all(manifest))
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_everything_the_image_copies_exists_and_is_let_through():
    """Each COPY source exists in the repository and the .dockerignore keeps it."""
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text(encoding="utf-8")
    for word, rest in instructions():
        if word != "COPY" or rest.startswith("--from"):
            continue
        source = shlex.split(rest)[0]
        if source != "dist/":  # made by `make wheel`
            assert (ROOT / source).exists(), source
        assert f"!{source.rstrip('/')}" in ignore, source
