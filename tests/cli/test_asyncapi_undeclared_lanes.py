"""``pipeline asyncapi DIR --app M:app`` names the app's lanes that DIR does not declare.

The document's channels are DIR's declarations; an ``--app`` gives the payload of each lane its
handler's pydantic model. A lane of the app that DIR does not declare (the app reads
``PIPELINE_TOPICS_DIR``, or its own directory, not DIR) had its model dropped without a word:
the document came out without that payload and the command exited 0, as if the app had none.
It still exits 0 (the document of DIR is right), with one warning line per such ``--app``
naming the lanes and DIR.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support import ROOT, cli_environment, run_pipeline

THREE_LANES_APP = '''\
"""An app of three lanes, declared in the directory beside it."""

from pathlib import Path

from pydantic import BaseModel

from pipeline.runtime import App, Context

app = App(Path(__file__).with_name("app_topics"))


class Alpha(BaseModel):
    a: str


class Beta(BaseModel):
    b: str


class Gamma(BaseModel):
    c: str


@app.handler("alpha")
async def alpha(event: Alpha, ctx: Context) -> None:
    """Nothing."""


@app.handler("gamma")
async def gamma(event: Gamma, ctx: Context) -> None:
    """Nothing."""


@app.handler("beta")
async def beta(event: Beta, ctx: Context) -> None:
    """Nothing."""
'''


def _declare(directory: Path, *lanes: str) -> Path:
    directory.mkdir()
    for lane in lanes:
        (directory / f"{lane}.yaml").write_text(f"name: {lane}\npartitions: 1\n", encoding="utf-8")
    return directory


def test_lanes_of_an_app_that_dir_does_not_declare_are_named(tmp_path: Path) -> None:
    """DIR declares alpha only: one line names beta and gamma and DIR; alpha's payload is kept."""
    module = tmp_path / "mod"
    module.mkdir()
    (module / "w13_three_lanes.py").write_text(THREE_LANES_APP, encoding="utf-8")
    _declare(module / "app_topics", "alpha", "beta", "gamma")
    declared = _declare(tmp_path / "declared", "alpha")
    env = cli_environment(tmp_path, PYTHONPATH=str(module))

    result = run_pipeline(
        "asyncapi", str(declared), "--format", "json", "--app", "w13_three_lanes:app", env=env
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        (
            f"warning: --app w13_three_lanes:app: lane(s) beta, gamma not declared in {declared};"
            " their payloads are left out"
        )
    ]
    schemas = json.loads(result.stdout)["components"]["schemas"]
    assert "Alpha" in schemas
    assert not {"Beta", "Gamma"} & set(schemas)


def test_one_line_per_app_and_none_for_an_app_whose_lanes_are_all_declared(
    tmp_path: Path,
) -> None:
    """The project's apps against a DIR of engagement only: a line each for the two others."""
    declared = tmp_path / "declared"
    declared.mkdir()
    shutil.copy(ROOT / "topics" / "engagement.yaml", declared)
    apps = ["consumers.messages:app", "consumers.engagement:app", "consumers.ai_turns:app"]

    result = run_pipeline(
        "asyncapi",
        str(declared),
        *(a for app in apps for a in ("--app", app)),
        env=cli_environment(tmp_path),
        cwd=ROOT,
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        (
            f"warning: --app consumers.messages:app: lane(s) messages not declared in {declared};"
            " their payloads are left out"
        ),
        (
            f"warning: --app consumers.ai_turns:app: lane(s) ai_turns not declared in {declared};"
            " their payloads are left out"
        ),
    ]
    assert "EngagementEvent" in result.stdout


def test_no_warning_when_dir_declares_every_lane_of_the_apps(tmp_path: Path) -> None:
    """The project's topics/ and apps: the document, nothing on stderr."""
    apps = ["consumers.messages:app", "consumers.engagement:app", "consumers.ai_turns:app"]
    result = run_pipeline(
        "asyncapi",
        str(ROOT / "topics"),
        *(a for app in apps for a in ("--app", app)),
        env=cli_environment(tmp_path),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
