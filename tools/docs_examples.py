"""Run the documentation's examples, so that a page cannot drift from the code.

Every fenced ```` ```python ```` block of a page runs, in the page's order, in one namespace per page, with the
page's own folder under ``--out`` as the working directory: a figure an example saves (``fig.savefig("x.png")``)
lands in ``docs/generated/<page>/x.png`` when ``make docs`` runs this, and the page shows it from there. A block
titled as a script (```` ```python title="train.py" ````) is a program of its own: it is written to that file and
run by the command its first line gives (``# run as: torchrun --standalone --nproc-per-node 2 train.py``; without
one, ``python train.py``), which must succeed. Every
``gpscale`` command of a page's shell blocks (fenced or indented) is parsed by the command line's own parser and its
protocol, method and dataset names are checked, without running it (most are benchmark runs of minutes or hours).

    python -m tools.docs_examples [--out docs/generated] [PAGE.md ...]
"""
from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)(?P<info>[^\n]*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
_RUN_AS = re.compile(r"^#\s*run as:\s*(?P<command>.+)$")


@dataclass(frozen=True)
class Block:
    """One code block of a page: its language ('' for an indented block), its first line number, its text and
    its title (a script's file name), if any."""
    lang: str
    line: int
    code: str
    title: str | None = None


def code_blocks(markdown: str) -> list[Block]:
    """The fenced and indented code blocks of ``markdown``, in order."""
    lines = markdown.splitlines()
    blocks, i, in_list_or_para = [], 0, False
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening:
            indent, fence = len(opening["indent"]), opening["fence"]
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
                j += 1
            title = _TITLE.search(opening["info"])
            blocks.append(Block(opening["lang"].lower(), i + 1, "\n".join(body), title and title["title"]))
            i, in_list_or_para = j + 1, False
            continue
        if lines[i].startswith("    ") and not in_list_or_para:
            body, j = [], i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                body.append(lines[j][4:])
                j += 1
            blocks.append(Block("", i + 1, "\n".join(body).rstrip()))
            i = j
            continue
        # an indented line right after text or a list item continues it (markdown's lazy continuation)
        in_list_or_para = bool(lines[i].strip())
        i += 1
    return blocks


def python_blocks(markdown: str) -> list[Block]:
    return [b for b in code_blocks(markdown) if b.lang in ("python", "py", "python3")]


def gpscale_commands(markdown: str) -> list[tuple[int, list[str]]]:
    """Every ``gpscale ...`` command line of the page's shell and indented blocks, as (line, argv after 'gpscale');
    a line continued with a backslash is joined, environment assignments and ``python -m gpscale.cli`` are read as
    the command."""
    found = []
    for block in code_blocks(markdown):
        if block.lang not in ("", "bash", "sh", "shell", "console"):
            continue
        text = re.sub(r"\\\n\s*", " ", block.code)
        for offset, line in enumerate(text.splitlines()):
            line = line.split(" #", 1)[0].strip()
            match = re.match(r"(?:\$\s*)?(?:[A-Z_]+=\S*\s+)*(?:gpscale|python3? -m gpscale\.cli)\s+(.*)$", line)
            if match:
                argv = shlex.split(match.group(1))
                argv = [a for a in argv if a not in ("...", "…")]
                found.append((block.line + offset, argv))
    return found


def check_command(argv: list[str]) -> None:
    """Parse ``gpscale`` ``argv`` with the command line's parser and check the protocol it names; raises
    ``ValueError`` naming what is wrong."""
    from gpscale.bench.files import FILES_PROTOCOL
    from gpscale.bench.floor import FLOOR_PROTOCOL
    from gpscale.bench.protocols import PROTOCOLS
    from gpscale.cli import _parser

    try:
        with redirect_stderr(io.StringIO()):
            args = _parser().parse_args(argv)
    except SystemExit as exit_:
        if exit_.code:
            raise ValueError(f"`gpscale {shlex.join(argv)}` does not parse") from None
        return
    protocol = getattr(args, "protocol", None)
    if protocol is not None and protocol not in {*PROTOCOLS, FLOOR_PROTOCOL, FILES_PROTOCOL}:
        raise ValueError(f"`gpscale {shlex.join(argv)}`: no protocol {protocol!r}")


@contextmanager
def _inside(folder: Path):
    before = Path.cwd()
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def run_page(page: Path, out: Path) -> float:
    """Run the page's python blocks in one namespace inside ``out / page.stem`` and check its commands; returns the
    seconds the blocks took. An exception names the page and the block's line."""
    import matplotlib

    matplotlib.use("Agg")
    markdown = page.read_text()
    for line, argv in gpscale_commands(markdown):
        try:
            check_command(argv)
        except ValueError as err:
            raise ValueError(f"{page.name}, line {line}: {err}") from None
    namespace: dict = {"__name__": "__main__"}
    start = time.perf_counter()
    with _inside(out / page.stem):
        for block in python_blocks(markdown):
            if block.title:
                run_script(block, page.name)
                continue
            try:
                exec(compile(block.code, f"{page.name}:{block.line}", "exec"), namespace)
            except Exception as err:
                raise RuntimeError(f"{page.name}, the python block at line {block.line}: {err!r}") from err
    import matplotlib.pyplot as plt

    plt.close("all")
    return time.perf_counter() - start


def run_script(block: Block, page: str) -> None:
    """Write a titled block to its file in the working directory and run it by its ``# run as:`` command."""
    Path(block.title).write_text(block.code + "\n")
    first = _RUN_AS.match(block.code.splitlines()[0])
    command = shlex.split(first["command"]) if first else ["python", block.title]
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    elif command[0] == "torchrun":  # the torchrun of this interpreter
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{page}, the script {block.title} at line {block.line} (`{shlex.join(command)}`) exited "
                           f"with {done.returncode}:\n{done.stderr[-3000:]}")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_examples", description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path, help="pages to run (default: every page of docs/)")
    parser.add_argument("--out", type=Path, default=DOCS / "generated", help="where each page's files go")
    args = parser.parse_args(argv)
    for page in args.pages or pages():
        seconds = run_page(page.resolve(), args.out.resolve())
        print(f"{page.name}: {len(python_blocks(page.read_text()))} python blocks, {seconds:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
