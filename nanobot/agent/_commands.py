"""Shell commands as approval rules see them: the key a saved rule binds to, and whether a
command runs code given inline (which may be approved once but never saved as "always").

Both answers err on the safe side. The key only ever merges spellings that the shell reads
the same way (runs of blanks outside quotes); anything this module cannot be sure about keeps
its exact text. The inline-code check is a pattern list, a speed bump and not a boundary (the
sandbox is the wall): it flags a command when in doubt, because a false alarm costs the user
one extra tap while a miss would save an "always" for code that changes under the rule.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

# Characters that end a word and form operators; the newline separates commands.
_PUNCTUATION: Final = ";&|()<>\n"
_BLANKS: Final = " \t"
# A here-document's body, command substitution, arithmetic, parameter expansion (whose words
# split on $IFS, which the command may change) and ANSI-C quoting have whitespace rules of
# their own; commands holding them keep their exact text.
_VERBATIM: Final = ("<<", "$(", "`", "${", "$'")

_SHELLS: Final = frozenset(
    {"sh", "bash", "rbash", "zsh", "dash", "ksh", "mksh", "pdksh", "ash", "yash", "posh"}
    | {"fish", "csh", "tcsh", "busybox", "pwsh", "powershell", "nu", "elvish", "xonsh"}
)
# Commands that read a script from their arguments or input (`source <(curl …)`).
_SOURCES: Final = frozenset({".", "source"})
_SHELL_FLAG: Final = re.compile(r"-[A-Za-z]*c[A-Za-z]*|--command(=.*)?|-command|-Command", re.S)
# Interpreters and the flags that hand them code on the command line.
_INTERPRETERS: Final[tuple[tuple[re.Pattern[str], re.Pattern[str]], ...]] = tuple(
    (re.compile(name), re.compile(flag, re.S))
    for name, flag in (
        (r"(python|pypy|jython|ipython)[0-9.]*", r"-[A-Za-z]*c.*|--command(=.*)?"),
        (r"(node|nodejs|bun)[0-9.]*", r"-[A-Za-z]*[ep]|--(eval|print)(=.*)?|eval"),
        (r"deno", r"eval|-[A-Za-z]*e|--eval(=.*)?"),
        (r"perl[0-9.]*", r"-[A-Za-z0-9]*[eE].*"),
        (r"(ruby|jruby|irb)[0-9.]*", r"-[A-Za-z]*e.*"),
        (r"php[0-9.]*", r"-[A-Za-z]*[rRBE].*"),
        (r"(lua|luajit)[0-9.]*", r"-[A-Za-z]*e.*"),
        (r"(Rscript|R)", r"-e|--expr(=.*)?"),
        (r"julia", r"-[A-Za-z]*[eE].*|--(eval|print)(=.*)?"),
        (r"osascript", r"-e"),
        (r"(tclsh|wish|expect)[0-9.]*", r"-c"),
    )
)
# Commands that run another command given in their arguments with its own option syntax.
_WRAPPERS: Final = frozenset(
    {"env", "sudo", "doas", "nohup", "timeout", "xargs", "nice", "ionice", "stdbuf", "time"}
    | {"setsid", "chrt", "taskset", "unbuffer", "command", "builtin", "exec", "chroot"}
    | {"unshare", "nsenter", "firejail", "strace", "ltrace", "flock", "parallel", "caffeinate"}
    | {"-exec", "-execdir", "-ok", "-okdir", "!", "{", "if", "then", "else", "elif", "while"}
    | {"until", "do"}
)
# Commands whose `-c` (or every argument) is a command line for a shell.
_RUN_VIA_SHELL: Final = frozenset({"su", "runuser", "script", "flock"})
_ALWAYS_SHELL: Final = frozenset({"watch", "eval"})
_REDIRECTS: Final = frozenset({"<", ">", ">>", "<>", ">|", "<&", ">&", "&>", "&>>"})
_OUTPUTS: Final = frozenset({">", ">>", ">|", "&>", "&>>"})
_FEEDS: Final = frozenset({"<<", "<<-", "<<<"})
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_PIPE: Final = re.compile(r"(?<!\|)\|(?!\|)")
_NESTED: Final = re.compile(r"[\s;&|()<>`]|\$\(")
_MAX_DEPTH: Final = 4
_STDIN_NAMES: Final = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
_SCRIPT_FILE: Final = re.compile(r"\.(py|pyw|js|mjs|cjs|ts|pl|pm|rb|php|lua|r|jl|tcl|exp)$", re.I)


def command_key(command: str) -> str:
    """The key a saved rule for `command` binds to: `command` with every run of unquoted,
    unescaped blanks made one space (a run holding a newline becomes one newline) and leading
    and trailing ones removed. A command that does not parse, or holds a here-document,
    command substitution, `${…}` or ANSI-C quoting, is its own key, byte for byte."""
    if any(mark in command for mark in _VERBATIM) or _tokens(command) is None:
        return command
    return _collapse(command)


def simple_commands(command: str) -> list[list[str]] | None:
    """The words of each simple command in `command` (quotes removed, operators and
    redirections dropped, and the file an output redirection writes; the file an input
    redirection reads kept), or None if it does not parse."""
    tokens = _tokens(command)
    if tokens is None:
        return None
    kept: list[str] = []
    for index, token in enumerate(tokens):
        # What a command writes to is its output, not code it runs.
        if index and tokens[index - 1] in _OUTPUTS:
            continue
        kept.append(token)
    return [simple.words for simple in _simple_commands(kept) if simple.words]


def inline_code(command: str) -> str | None:
    """Why `command` counts as running code given inline, or None when it does not.

    Inline: a shell or interpreter given code on its command line (`sh -c`, `bash -lc`,
    `python3 -c`, `node -e`, `perl -e`, `ruby -e`, …), or fed code through a pipe, a
    here-document or a process substitution (`curl x | sh`, `python3 <<EOF`, `bash <(…)`),
    `eval`, `watch`, a command whose name comes from a variable or substitution
    (`$CMD`), any of these behind `env`, `sudo`, `nohup`, `timeout`, `xargs`, `find -exec` and
    the like, or inside a quoted argument or a `$(…)`. A command that does not parse also
    counts (what it runs cannot be told).
    """
    return _inline(command, depth=0)


def _inline(command: str, depth: int) -> str | None:
    tokens = _tokens(command)
    if tokens is None:
        return "it could not be parsed as a shell command"
    for simple in _simple_commands(tokens):
        reason = _inline_simple(simple, nested=depth > 0)
        if reason is not None:
            return reason
    if depth < _MAX_DEPTH:
        for token in tokens:
            # A quoted argument or a substitution may hold a command line of its own
            # (`env -S "sh -c x"`, `echo "$(curl x | sh)"`); it is read as one, a backtick
            # substitution as a command of its own.
            if not _is_operator(token) and _NESTED.search(token):
                reason = _inline(token.replace("`", "\n"), depth + 1)
                if reason is not None:
                    return reason
    return None


@dataclass(slots=True)
class _Simple:
    """The words of one simple command, and how its input is fed to it."""

    words: list[str] = field(default_factory=list)
    fed: bool = False  # by a pipe, a here-document or a here-string
    substituted: bool = False  # an argument is a process substitution <(…)


def _simple_commands(tokens: Sequence[str]) -> Iterator[_Simple]:
    current = _Simple()
    for token in tokens:
        if not _is_operator(token):
            current.words.append(token)
        elif token in _FEEDS:
            current.fed = True
        elif token in _REDIRECTS:
            continue
        else:
            # Operators end the command (a process substitution starts a nested one); what
            # follows the `)` is read as a command of its own, which can only add alarms.
            current.substituted = current.substituted or "<(" in token
            yield current
            current = _Simple(fed=bool(_PIPE.search(token)))
    yield current


def _inline_simple(simple: _Simple, *, nested: bool) -> str | None:
    words = simple.words
    start = 0
    while start < len(words) and _ASSIGNMENT.match(words[start]):
        start += 1
    wrapped = False
    for index in range(start, len(words)):
        word = words[index]
        name = _basename(word.strip("`"))
        in_command_position = index == start or wrapped
        if in_command_position and not nested and word.startswith(("$", "`")):
            return f"it runs a command named by a variable or substitution ({word})"
        # A backtick substitution inside a command is a command of its own.
        if in_command_position or word.startswith("`"):
            rest = [arg.strip("`") for arg in words[index + 1 :]]
            reason = _runs_inline(name, rest, simple)
            if reason is not None:
                return reason
        wrapped = wrapped or name in _WRAPPERS
    return None


def _runs_inline(name: str, rest: Sequence[str], simple: _Simple) -> str | None:
    """Why the command `name`, with the arguments `rest`, runs inline code."""
    if name in _ALWAYS_SHELL:
        return f"{name} runs its arguments as shell code"
    fed = simple.fed or simple.substituted
    if name in _SHELLS or name in _SOURCES:
        return _shell_reason(name, rest, fed=fed)
    if name in _RUN_VIA_SHELL and any(_SHELL_FLAG.fullmatch(arg) for arg in rest):
        return f"{name} runs a command line given inline"
    for pattern, flags in _INTERPRETERS:
        if pattern.fullmatch(name):
            flag = next((arg for arg in rest if flags.fullmatch(arg)), None)
            if flag is not None:
                return f"it runs code given inline ({name} {flag})"
            if fed and _reads_program_from_input(rest):
                return f"it feeds code to an interpreter ({name} reads it from its input)"
    return None


def _shell_reason(name: str, rest: Sequence[str], *, fed: bool) -> str | None:
    flag = next((arg for arg in rest if _SHELL_FLAG.fullmatch(arg)), None)
    if flag is not None and name not in _SOURCES:
        return f"it runs shell code given inline ({name} {flag})"
    if fed:
        return (
            f"it feeds code to a shell ({name} reads it from a pipe, a here-document or a"
            " process substitution)"
        )
    return None


def _reads_program_from_input(args: Sequence[str]) -> bool:
    """Whether an interpreter with input fed to it may take its program from that input:
    unless a script file is named (`cat data | python3 tool.py`), it may."""
    if any(arg in _STDIN_NAMES for arg in args):
        return True
    return not any(_SCRIPT_FILE.search(arg) for arg in args if not arg.startswith("-"))


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1] if word not in {"/", ""} else word


def _is_operator(token: str) -> bool:
    return bool(token) and all(char in _PUNCTUATION for char in token)


def _tokens(command: str) -> list[str] | None:
    """The words and operators of `command` (quotes removed), or None if it does not parse."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    # The shell starts a comment only at the start of a word, shlex anywhere in one, which
    # would hide `x#|sh` from the check: no comments, a real one is read as words.
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return None


def _collapse(command: str) -> str:
    """Runs of unquoted, unescaped blanks made one space (or one newline if they hold one)."""
    out: list[str] = []
    run = ""
    quote = ""
    chars = iter(command)
    for char in chars:
        if not quote and char in _BLANKS + "\n":
            run += char
            continue
        if run:
            if out:
                out.append("\n" if "\n" in run else " ")
            run = ""
        out.append(char)
        if char == "\\" and quote != "'":
            out.append(next(chars, ""))
        elif char in "'\"" and not quote:
            quote = char
        elif char == quote:
            quote = ""
    return "".join(out)
