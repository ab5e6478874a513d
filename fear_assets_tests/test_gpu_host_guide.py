"""docs/gpu-host.md's commands are the command line's: every `fear` line of the guide parses
with the real parser (and names the guide's family). The guide's `fear --site FILE run FAMILY
--through STAGE` and `fear status FAMILY` run on the embedded family, with a site configuration
that points its checkpoint at its cached files, in test_cli.py
(``test_run_through_stimuli_records_its_runs_and_status_reports_where_the_family_stands``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fear_assets.defs import cli


ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "gpu-host.md"
GUIDE_FAMILY = "qwen2.5-7b"


def guide_commands() -> list[list[str]]:
    """The argument lists of every `fear ...` line in the guide's shell blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    out = []
    for line in (ln for b in blocks for ln in b.splitlines()):
        if not re.search(r"(^|\s|/)fear\s", line):
            continue
        words = shlex.split(line.split(" #")[0].replace("<run id>", "RUN_ID"))
        for i, w in enumerate(words):
            if w in (".venv/bin/fear", "fear"):
                out.append(words[i + 1:])
                break
    return out


def test_every_fear_command_of_the_guide_parses():
    commands = guide_commands()
    used = {next((w for w in args if not w.startswith("-")), "--help") for args in commands}
    assert {"run", "status", "register", "cancel"} <= used, used
    parser = cli.parser()
    for args in commands:
        if args == ["--help"]:
            continue
        parsed = parser.parse_args(args)  # argparse exits on an unknown command or option
        if getattr(parsed, "family", None) is not None:
            assert parsed.family == GUIDE_FAMILY


@pytest.mark.parametrize("text", ["fear_assets/core/site.py", "deploy/site.example.yaml", "FEAR_ASSETS_SITE"])
def test_the_guide_names_the_site_configuration(text):
    assert text in GUIDE.read_text(encoding="utf-8")
