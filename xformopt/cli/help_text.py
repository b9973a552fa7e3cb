"""`--help` as plain text that reads at 80 columns, in a terminal, a pipe or a file alike.

Typer's rich help draws options as a four-column table (long name, short name, value, description)
and at 80 columns leaves the description a column of one or two words per line. Click's plain
layout (name, then the description from column 34, at most 78 wide) keeps ~44 columns for every
description at any width, and one layout is what the tests check and the docs' CLI reference shows.

Click re-wraps every help paragraph, which breaks the example command lines; this module keeps
them as lines: a paragraph under a heading that ends with ':' ("Examples:"), indented, is code,
and a one-line "Example: CMD" is shown as the heading and CMD. A code line longer than the width is
continued with a shell ``\\`` at a space outside quotes (so it still pastes into a shell), and a
trailing ``# comment`` that does not fit moves onto its own line above the command.
"""

from __future__ import annotations

import re
import textwrap

CODE_INDENT = "  "  # under the formatter's own indentation
_COMMENT = re.compile(r"^(?P<cmd>.*?\S)\s{2,}(?P<comment>#.*)$")


def paragraphs(text: str) -> list[list[str]]:
    """Blank-line separated paragraphs, each a list of lines with its own indentation removed."""
    blocks, current = [], []
    for line in text.expandtabs().splitlines():
        if line.strip():
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def split_unquoted(command: str) -> list[str]:
    """COMMAND's words, split at spaces outside '...' and "..." (a jq program stays one word)."""
    words, current, quote = [], "", None
    for char in command:
        if quote:
            current += char
            quote = None if char == quote else quote
        elif char in "'\"":
            current += char
            quote = char
        elif char == " ":
            if current:
                words.append(current)
            current = ""
        else:
            current += char
    if current:
        words.append(current)
    return words


def _units(words: list[str]) -> list[str]:
    """Words that stay on one line: an option with its value, a pipe with the command after it."""
    units: list[str] = []
    for word in words:
        previous = units[-1] if units else ""
        joins = (previous.startswith("-") and " " not in previous and not word.startswith("-")) or previous in ("|", "&&")
        if joins and word not in ("|", "&&"):
            units[-1] = f"{previous} {word}"
        else:
            units.append(word)
    return units


def code_lines(line: str, width: int) -> list[str]:
    """One example command as lines of at most WIDTH (where its words allow)."""
    line = line.strip()
    if len(line) <= width:
        return [line]
    out = []
    if (match := _COMMENT.match(line)) is not None:  # the comment above, the command below
        out += textwrap.wrap(match["comment"], width, subsequent_indent="# ")
        line = match["cmd"]
    rows, row = [], ""
    for word in _units(split_unquoted(line)):
        candidate = f"{row} {word}" if row else word
        # room for " \" on every row but the last; continuation rows are indented 4
        if row and len(candidate) + 2 > width - (4 if rows else 0):
            rows.append(row)
            row = word
        else:
            row = candidate
    rows.append(row)
    return out + [("    " if i else "") + r + (" \\" if i < len(rows) - 1 else "") for i, r in enumerate(rows)]


def write(formatter, text: str) -> None:
    """Write help TEXT (a docstring plus example blocks) into a click HelpFormatter."""
    heading = False
    for block in paragraphs(text):
        base = min(_indent(line) for line in block)
        lines = [line[base:] for line in block]
        one_example = re.match(r"^(Examples?):\s+(\S.*)$", lines[0]) if len(lines) == 1 else None
        formatter.write_paragraph()
        if one_example is not None:  # "Example: xformopt ..." on one line: the heading, then the command
            formatter.write_text(f"{one_example[1]}:")
            _write_code(formatter, [one_example[2]])
        elif heading and base > 0:  # the lines under "Examples:" / "Decoders (...):"
            _write_code(formatter, lines)
        else:
            formatter.write_text(" ".join(line.strip() for line in lines))
        heading = lines[-1].rstrip().endswith(":")


def _write_code(formatter, lines: list[str]) -> None:
    width = formatter.width - formatter.current_indent - len(CODE_INDENT)
    for line in lines:
        for row in code_lines(line, width):
            formatter.write(f"{' ' * formatter.current_indent}{CODE_INDENT}{row}\n")
