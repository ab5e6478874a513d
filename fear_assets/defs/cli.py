"""The ``fear`` command line: ``fear demo | run | status | register | cancel | rehearse | ui``.

This module is the console script (``[project.scripts] fear``): it parses and checks the
arguments with the standard library and the registered settings only, so ``--help`` at every
level answers at once and touches neither the store nor the instance. The commands
themselves (``fear_assets.defs.commands``) import the Dagster definitions, which read the site
configuration when they are imported; so this module sets ``$FEAR_ASSETS_SITE`` (from
``--site``) and ``$DAGSTER_HOME`` (default: the project root) first and then replaces its
process with the commands module under that environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.settings import PROJECT_ROOT, load_settings, settings_path
from fear_assets.core.site import SITE_ENV, load_site

#: The module the checked command runs in (``python -m``).
COMMANDS_MODULE = "fear_assets.defs.commands"
#: ``fear rehearse`` runs in its own module: it sets up a workspace, then runs ``fear`` there.
REHEARSE_MODULE = "fear_assets.rehearsal.run"
REGISTER_ARGS = "--stage1-id ID --supplementary-note FILE"


def parser() -> argparse.ArgumentParser:
    """The whole command tree (``commands`` parses the same argv with it)."""
    p = argparse.ArgumentParser(
        prog="fear", description="Run a registered family of 'Two Facts, One Gate' through the project's Dagster "
                                 "instance: its stages in the protocol's order, where it stands, its registration.",
        epilog="The instance is $DAGSTER_HOME (default: the project root); the store is $FEAR_ASSETS_DUCKDB or the "
               "site configuration's. `fear COMMAND --help` describes each command.")
    p.add_argument("--site", metavar="FILE",
                   help=f"this host's site configuration (checkpoint directories, device, pools, store; default: "
                        f"${SITE_ENV}; example: deploy/site.example.yaml)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("demo", help="the main job on the embedded family (bash scripts/fear main)",
                   description="The main job: every stage of the embedded family, then its summary "
                               "(the same as python -m fear_assets.defs.main).")
    run = sub.add_parser("run", help="run a family's stages in order, stopping at the first failed blocking gate",
                         description="Materialise FAMILY's stages in the protocol's order through the project's "
                                     "instance (the runs show in the UI). Stops at the first failed step or failed "
                                     "blocking gate and says what to do. Rerunning resumes: partitions an earlier run "
                                     "finished from the same code, settings and bank are kept (until a step reruns), "
                                     "and a scoring step reuses its finished chunks.")
    run.add_argument("family", metavar="FAMILY", help="a registered family (data/protocol_settings.yaml, families)")
    run.add_argument("--rerun", action="store_true",
                     help="materialise every partition again (default: keep the partitions an earlier run built "
                          "from the same code, settings and bank)")
    run.add_argument("--through", metavar="STAGE",
                     help="the last stage to run (default: every stage; stimuli, pilot, registration, collection, "
                          "probes, analysis, reading)")
    status = sub.add_parser("status", help="each stage, asset and gate of a family, and the next action",
                            description="Each stage of FAMILY: its assets (materialised / expected partitions), its "
                                        "checks (passed / failed / not run) and the next action; and the runs of "
                                        "the instance left in progress by a worker that is gone.")
    status.add_argument("family", metavar="FAMILY", help="a registered family")
    register = sub.add_parser("register", help="issue a family's registration record (pilot -> confirmatory)",
                              description="Issue FAMILY's registration record from its draft (status registered, the "
                                          "Stage 1 identifier, the time, every frozen hash). From then on the "
                                          "family's gates block; other families keep their mode.")
    register.add_argument("family", metavar="FAMILY", help="a registered family")
    register.add_argument("--stage1-id", required=True, metavar="ID",
                          help="the Stage 1 identifier the journal or registry gave the protocol")
    register.add_argument("--supplementary-note", required=True, metavar="FILE",
                          help="the supplementary note filed with the Stage 1 protocol")
    cancel = sub.add_parser("cancel", help="mark a run whose worker is gone canceled and free its pool slots",
                            description="Mark RUN_ID canceled in the instance and free the concurrency slots it "
                                        "holds (an orphaned run keeps the 'gpu' slot and every later model step "
                                        "waits). `fear status FAMILY` lists such runs.")
    cancel.add_argument("run_id", metavar="RUN_ID", help="the run's id (fear status prints it)")
    cancel.add_argument("--force", action="store_true",
                        help="cancel even though the run's process is still alive on this host")
    rehearse = sub.add_parser(
        "rehearse", help="a registered family end to end at its registered shape on random-weight stand-ins",
        description="Rehearse FAMILY before spending GPU hours: every block, branch, reader and depth of its "
                    "registered design, pilot to Stage 2 report, in confirmatory mode, on tiny random-weight "
                    "models of the registered architectures with the registered tokenizers, in a workspace of "
                    "its own (data/rehearsal/). Reduced only in confirmatory frames per fear (--frames), the "
                    "depths kept (--depths) and a reduced power simulation; every output says REHEARSAL. "
                    "Writes rehearsal.json (every step's time and peak memory; documents, tokens and "
                    "exclusions per table and partition).")
    rehearse.add_argument("family", metavar="FAMILY", help="a registered family (not the embedded demo)")
    rehearse.add_argument("--frames", type=int, default=1, help="confirmatory frames per fear (default 1)")
    rehearse.add_argument("--depths", default=None,
                          help="depths to keep, in tokens, comma-separated (default: every registered depth)")
    rehearse.add_argument("--dir", default=None, help="the workspace (default: data/rehearsal/<family>-f<N>...)")
    rehearse.add_argument("--through", default=None, metavar="STAGE", help="the last stage (default: every stage)")
    rehearse.add_argument("--device", default="cpu", help="the stand-ins' device (default cpu)")
    ui = sub.add_parser("ui", help="the Dagster UI and daemon on the project's instance (dagster dev)",
                        description="dagster dev -w workspace.yaml on the project's instance, after applying the "
                                    "site configuration's pools to it.")
    ui.add_argument("--port", type=int, default=None, help="the UI's port (dagster dev's default: 3000)")
    ui.add_argument("--host", default=None, help="the address the UI listens on (dagster dev's default: 127.0.0.1)")
    return p


def check_family(p: argparse.ArgumentParser, args: argparse.Namespace, families) -> None:
    """An unknown family is a usage error naming the registered ones (exit 2)."""
    family = getattr(args, "family", None)
    if family is not None and family not in families:
        p.error(f"argument FAMILY: unknown family {family!r} (choose from {', '.join(families)})")


def environment(args: argparse.Namespace, environ=None) -> dict[str, str]:
    """The commands' environment: ``$FEAR_ASSETS_SITE`` from ``--site`` (absolute), and
    ``$DAGSTER_HOME`` defaulting to the project root."""
    env = dict(os.environ if environ is None else environ)
    if args.site:
        env[SITE_ENV] = str(Path(args.site).expanduser().resolve())
    env.setdefault("DAGSTER_HOME", str(PROJECT_ROOT))
    return env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = parser()
    args = p.parse_args(argv)
    env = environment(args)
    try:
        settings = load_settings(settings_path())
        check_family(p, args, settings.families)
        load_site(env.get(SITE_ENV) or None, registered_checkpoints=settings.models)
    except FearAssetsError as exc:  # the settings or the site file: its message names the field and the fix
        print(f"fear: {exc}", file=sys.stderr)
        return 2
    if args.command == "rehearse":  # the rehearsal writes its own environment for the commands it runs
        os.execve(sys.executable, [sys.executable, "-m", REHEARSE_MODULE, *argv[argv.index("rehearse") + 1:]], env)
    os.execve(sys.executable, [sys.executable, "-m", COMMANDS_MODULE, *argv], env)
    return 0  # not reached: execve replaces this process


if __name__ == "__main__":
    sys.exit(main())
