#!/usr/bin/env python3
"""Prints `file:line name lines` for each function longer than N lines (default 80).

A function is counted from its opening line to its closing brace: a definition at namespace
scope closes with `}` at column 0, a member defined inside its class (two-space indent under
clang-format) with `  }` at column 2. Lambdas and local classes count to their function.
Usage: scripts/long_functions.py [-n N] FILE...
"""
import argparse
import re
import sys

# A definition's first line: a return type or qualifier then name(  -- not a control statement.
HEAD = re.compile(r"^( {0,2})(?!(?:if|for|while|switch|return|case|else|do)\b)"
                  r"[A-Za-z_~][\w:<>,*&\s~]*?\b([~\w:]+)\s*\(")
SKIP = ("namespace", "struct", "class", "enum", "using", "typedef", "#", "//", "}", "public:",
        "private:", "protected:")


def functions(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        m = HEAD.match(lines[i])
        if not m or lines[i].lstrip().startswith(SKIP) or lines[i].rstrip().endswith(";"):
            i += 1
            continue
        indent = m.group(1)
        # The body opens on this line or on a continuation line of the signature.
        j = i
        while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
            j += 1
        if j >= len(lines) or lines[j].rstrip().endswith(";") or lines[j].rstrip().endswith("}"):
            i = j + 1
            continue
        close = indent + "}"
        k = j + 1
        while k < len(lines) and not (lines[k].startswith(close) and
                                      (len(lines[k]) == len(close) or
                                       lines[k][len(close)] in " ;/")):
            k += 1
        yield i + 1, m.group(2), k - i + 1
        i = k + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=80, help="report functions over this many lines")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    for path in args.files:
        for line, name, count in functions(path):
            if count > args.n:
                print(f"{path}:{line} {name} {count}")


if __name__ == "__main__":
    sys.exit(main())
