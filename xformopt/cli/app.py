"""The `xformopt` command: one Typer app, one module per command group, one error path.

Exit codes: 0 ok, 1 a gate failed, 2 bad input or usage, 3 a pass failed.
"""

from __future__ import annotations

import os
import sys

import typer

from xformopt.cli import (
    bench,
    cache,
    catalog,
    command,
    generate,
    loadtest,
    optimize,
    output,
    passes,
    profile,
    recipes,
    report,
    search,
    serve,
    targets,
)
from xformopt.cli.command import UsageError, usage_line
from xformopt.errors import XformoptError
from xformopt.signals import Interrupted, interruptible, received
from xformopt.version import __version__

app = typer.Typer(
    name="xformopt",
    help="Export, fuse and quantize Hugging Face transformers into verified ONNX artifacts, "
    "with an accuracy/latency report against the PyTorch baseline.\n\n"
    "Example: xformopt optimize minilm --target avx512_vnni -o out/",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _version(value: bool) -> None:
    if value:
        output.stdout.print(f"xformopt {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No log lines or progress on stderr (errors still print); "
                               "also accepted after the command."),
) -> None:
    output.set_quiet(quiet)
    output.install_log_handler()


def _register() -> None:
    optimize.register(app)
    bench.register(app)
    report.register(app)
    passes.register(app)
    generate.register(app)
    search.register(app)
    profile.register(app)
    serve.register(app)
    loadtest.register(app)
    app.add_typer(catalog.app, name="passes")
    app.add_typer(recipes.app, name="recipes")
    app.add_typer(targets.app, name="targets")
    app.add_typer(cache.app, name="cache")
    command.apply(app)  # flags without <bool>, MODEL/DIR usage lines, on every command


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: runs the app and turns every error into one line and an exit code."""
    # Hub ids download through huggingface_hub (xformopt/sources/hub.py); offline only when the user sets
    # HF_HUB_OFFLINE=1 or the hub is unreachable, so neither it nor TRANSFORMERS_OFFLINE is forced here.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # PyTorch's OpenMP pool must not spin either (see xformopt.runtime.session.ort_session); it reads this once,
    # when torch is first imported, so it is set before any command runs. Measured on a 2-core
    # host: MiniLM at batch 1 in PyTorch took 35 ms with spinning and 13 ms without.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = sys.argv[1:] if argv is None else list(argv)
    root = typer.main.get_command(app)
    try:
        # Not standalone: usage errors (unknown option, missing argument, bad value) come back here
        # and print as one line like every other error, instead of Click's 5-line box.
        with output.progress_display(), interruptible():
            try:
                code = root.main(args=argv, prog_name="xformopt", standalone_mode=False)
            except Exception:
                if (signal_exc := received()) is not None:  # the signal's exception was replaced on its way up
                    raise signal_exc from None
                raise
        if isinstance(code, int) and code:  # typer.Exit(code), e.g. from a callback
            sys.exit(code)
    except UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `xformopt` or `xformopt recipes` alone: Typer printed the help
            sys.exit(2)
        output.error(usage_line(exc, root, argv))
        sys.exit(2)
    except XformoptError as exc:
        output.error(exc.message)
        if getattr(exc, "accept", None):  # a gate missed, its best attempt written: how to accept it
            from xformopt.cli.accept import accept_command

            output.error(f"to accept it: {accept_command(argv, exc.accept)}")
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        output.error(f"interrupted ({exc.name})")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        output.error("interrupted (SIGINT)")
        sys.exit(130)
    except Exception as exc:  # a bug or a library failure: one line, exit 3, traceback on request
        if os.environ.get("XFORMOPT_DEBUG"):
            raise
        output.error(f"{type(exc).__name__}: {exc} (set XFORMOPT_DEBUG=1 for the traceback)")
        sys.exit(3)

if __name__ == "__main__":  # pragma: no cover
    main()
