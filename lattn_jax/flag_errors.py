"""One-line errors for absl binaries: a bad command line ends with ``error: <what>``, status 1.

``app.run(main)`` reports a missing required flag or a bad flag value as absl's two-line ``FATAL
Flags parsing error: ... Pass --helpshort ...``; binaries pass ``flags_parser=parse_flags``
instead. This module imports only absl (no jax, numpy or ml_collections), so that light binaries
(``fetch_eval_data.py``, the benchmark drivers) stay light; :mod:`lattn_jax.config` re-exports it.
"""

import difflib
import os
import re
import shlex
import signal
import sys
import traceback
from typing import Optional

from absl import flags


def parse_flags(argv, unknown_option_hint=None):
    """Parses absl flags for a binary (``app.run(main, flags_parser=parse_flags)``).

    Everything that can fail here comes from the command line (a typo in a ``--config.*``
    option, an unknown ``file.py:arg`` variant, a value of the wrong type), so a failure ends the
    process with one line, ``error: <what>`` (:func:`describe_flag_error`), and no traceback.

    Args:
      argv: the command line, ``sys.argv`` as absl passes it.
      unknown_option_hint: optional ``f(key, argv) -> str or None``, for an unknown
        ``--config.<key>...`` that ml_collections offers no "did you mean" for: a returned text
        is appended in parentheses (:func:`describe_flag_error`).

    Returns:
      The remaining arguments (absl's ``FLAGS(argv)``).

    Raises:
      SystemExit: on any flag or config error.
    """
    bare = bare_tuple_override(argv) or repeated_tuple_override(argv)
    if bare:
        sys.exit(f"error: {bare}")
    try:
        return flags.FLAGS(argv)
    except Exception as e:  # noqa: BLE001 - all of these are user input errors
        # A config file's own failure (a bug in its get_config()) is not a command-line error:
        # its file and line, not "unknown config option" or a bare "division by zero".
        sys.exit(describe_config_file_error(e, argv)
                 or f"error: {describe_flag_error(e, argv, unknown_option_hint)}")


class ConfigArgumentError(ValueError):
    """A config file's refusal of the argument after the colon (``--config=file.py:arg``): a
    mistake on the command line, reported as its message alone (``configs.common.ConfigArgError``
    derives from it), not as an error in the file (:func:`describe_config_file_error`)."""


def _config_files(argv):
    """``{real path: (flag, path as given)}`` for each ``--<flag>=<file>.py[:arg]`` (or
    ``--<flag> <file>.py``) of ``argv`` that names an existing file."""
    files = {}
    args = list(argv)[1:]
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        flag, eq, value = arg[2:].partition("=")
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        path = value.split(":", 1)[0]
        if path.endswith(".py") and os.path.isfile(path):
            files[os.path.realpath(path)] = (flag, path)
    return files


def _exception_chain(error):
    """``error`` and the exceptions it wraps, outermost first: ``args[0]`` exceptions
    (ml_collections' ``AttributeError(KeyError(...))``), causes and contexts (the original of
    ml_collections' and absl's re-raised ``ValueError``s)."""
    seen, todo = [], [error]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        if e.args and isinstance(e.args[0], BaseException):
            todo.append(e.args[0])
        todo += [e.__cause__, e.__context__]
    return seen


def describe_config_file_error(error, argv=()) -> Optional[str]:
    """The one line for an exception raised by the code of a config file named on the command
    line (its module body or its ``get_config()``), or ``None`` for any other error.

    Told apart by the traceback: the error, or one it wraps (absl and ml_collections re-raise
    a config's ``ValueError`` and ``TypeError`` with the original as context), passed through a
    frame of the file. Before, a ``KeyError`` in ``get_config()`` read as ``unknown config
    option 'boom'`` and ``1/0`` as a bare ``division by zero``.

    Args:
      error: the exception flag parsing (or reading the config flag's value) raised.
      argv: the command line, program first, to find the config files (``--config=x.py:arg``).

    Returns:
      ``error in --config=configs/x.py (line 12): ZeroDivisionError: division by zero`` (the
      line of the file's innermost frame; the message on one line), or ``None``: the error did
      not come from a config file's code, or it is a :class:`ConfigArgumentError` (a bad
      ``:arg``, reported as today by :func:`describe_flag_error`).
    """
    files = _config_files(argv)
    if not files:
        return None
    for exc in _exception_chain(error):
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if os.path.realpath(f.filename) in files]
        if not frames:
            continue
        if isinstance(exc, ConfigArgumentError):
            return None
        flag, path = files[os.path.realpath(frames[-1].filename)]
        inner = exc
        while inner.args and isinstance(inner.args[0], BaseException):
            inner = inner.args[0]
        text = str(inner)  # KeyError('boom') -> "'boom'", as Python prints it
        if (isinstance(inner, KeyError) and inner.args and isinstance(inner.args[0], str)
                and inner.args[0][:1] in "'\""):  # ml_collections' "'key'\nDid you mean ..."
            text = inner.args[0]
        text = " ".join(line.strip() for line in str(text).splitlines() if line.strip())
        return (f"error in --{flag}={path} (line {frames[-1].lineno}): "
                f"{type(exc).__name__}{': ' + text if text else ''}")
    return None


# Tuple-valued options whose command-line value ml_collections would take, written without
# parentheses, as a one-element tuple of the whole string ("gdn" -> ("gdn",), "gdn,attn" ->
# ("gdn,attn",)): a silent one-layer model, or an unhelpful unknown-mixer error.
TUPLE_OPTIONS = ("layer_pattern",)
# Tuple-of-path options: one bare path is read as a one-element tuple (fine, and repeating the
# option adds more), but a bare comma list ("/a,/b") fails inside ml_collections with a generic
# "Error while parsing string ... as tuple" whose suggestion (quote it) gives one wrong path.
PATH_TUPLE_OPTIONS = ("paths",)


def _config_options(argv):
    """Yields ``(name, value)`` for each ``--config.<field>`` option of ``argv`` (its first word
    is the program), in the ``--name=value`` and ``--name value`` forms; ``name`` without the
    dashes."""
    args = list(argv)[1:]
    for i, arg in enumerate(args):
        if arg.startswith("--config."):
            name, eq, value = arg[2:].partition("=")
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            yield name, value


def bare_tuple_override(argv) -> Optional[str]:
    """The error for a ``--config.<...>.layer_pattern`` value that is not written as a tuple
    (``"('gdn','gdn','attn')"``), or for a ``--config.<...>.paths`` value that is a bare comma
    list (``/a,/b``), or ``None`` when there is none.

    Args:
      argv: the command line (``--name=value`` and ``--name value`` forms).
    """
    for name, value in _config_options(argv):
        if name.rsplit(".", 1)[-1] in TUPLE_OPTIONS and not value.strip().startswith(("(", "[")):
            names = [v.strip() for v in value.split(",") if v.strip()]
            example = ("(" + ",".join(repr(n) for n in names)
                       + ("," if len(names) == 1 else "") + ")")
            return (f"--{name}={value}: write a tuple of mixer names, e.g. "
                    f"--{name}=\"{example}\"; without parentheses the whole value would be "
                    f"read as one layer named {value!r}")
        if (name.rsplit(".", 1)[-1] in PATH_TUPLE_OPTIONS and "," in value
                and not value.strip().startswith(("(", "["))):
            parts = [v.strip() for v in value.split(",") if v.strip()]
            example = ("(" + ",".join(repr(p) for p in parts)
                       + ("," if len(parts) == 1 else "") + ")")
            repeated = " ".join(f"--{name}={p}" for p in parts)
            return (f"--{name}={value}: write several paths as a tuple, e.g. "
                    f"--{name}=\"{example}\", or give the option once per path ({repeated})")
    return None


def repeated_tuple_override(argv) -> Optional[str]:
    """The error for a ``--config.<field>`` option given more than once with tuple values, or
    ``None`` when there is none.

    ml_collections joins the values of a repeated tuple-field option instead of keeping the last
    one, as it does for other options: ``--config.model.layer_pattern="('gdn',)"
    --config.model.layer_pattern="('attn',)"`` trains ``('gdn', 'attn')``, and two
    ``data.paths`` tuples read both corpora. Values not written as tuples (``--config.x=a
    --config.x=b``, ml_collections' way to build ``('a', 'b')``) are left alone.

    Args:
      argv: the command line (``--name=value`` and ``--name value`` forms).

    Returns:
      ``--<name> is given N times with tuple values (...): ml_collections joins them into
      (...) instead of keeping the last; give it once, with the whole tuple``, for the first
      such option, else ``None``.
    """
    values = {}
    for name, value in _config_options(argv):
        if value.strip().startswith(("(", "[")):
            values.setdefault(name, []).append(value.strip())
    for name, given in values.items():
        if len(given) > 1:
            return (f"--{name} is given {len(given)} times with tuple values "
                    f"({', '.join(given)}): ml_collections joins them instead of keeping the "
                    f"last; give it once, with the whole tuple")
    return None


def reject_arguments(argv, command_line=None) -> None:
    """Ends the process with one line when the command line held words that are not flags.

    A binary's ``main(argv)`` calls it first: absl passes ``main`` the program and the words
    that are no flag (``app.UsageError`` printed the whole help text before its last line).

    Args:
      argv: what absl left of the command line (the program, then the stray words).
      command_line: the whole command line (default ``sys.argv``), for the hint: where the
        first stray word follows a ``--flag=value`` (or ``--flag value``), it was most likely
        a value with spaces left unquoted, and the line shows the quoted flag.

    Raises:
      SystemExit: ``error: unexpected arguments ['history', 'of'] (quote a value with
        spaces: --prompt="The history of")`` (the hint only where it applies); nothing when
        ``argv`` holds the program alone.
    """
    extra = list(argv[1:])
    if not extra:
        return
    line = list(sys.argv if command_line is None else command_line)
    hint = ""
    start = line.index(extra[0], 1) if extra[0] in line[1:] else 0
    if start >= 2 and line[start - 1].startswith("--") and "=" in line[start - 1]:
        flag, value = line[start - 1].split("=", 1)
    elif (start >= 3 and line[start - 2].startswith("--") and "=" not in line[start - 2]
          and not line[start - 1].startswith("-")):
        flag, value = line[start - 2], line[start - 1]
    else:
        flag = None
    if flag:
        end = start
        while end < len(line) and not line[end].startswith("-"):
            end += 1
        quoted = " ".join([value] + line[start:end])
        quoted = f'"{quoted}"' if not re.search(r'["$`\\]', quoted) else shlex.quote(quoted)
        hint = f" (quote a value with spaces: {flag}={quoted})"
    sys.exit(f"error: unexpected arguments {extra}{hint}")


def describe_flag_error(error, argv=(), unknown_option_hint=None, flag_values=None) -> str:
    """One line for an error raised while parsing flags (ml_collections nests and embeds them).

    Args:
      error: the exception ``flags.FLAGS(argv)`` raised.
      argv: the command line, to name a mistyped ``--config.a.b`` option in full.
      unknown_option_hint: as :func:`parse_flags`'s.
      flag_values: the ``FlagValues`` that parsed ``argv`` (default ``flags.FLAGS``), for the
        options of the config an unknown override was meant for (:func:`suggest_options`).

    Returns:
      The message: an unknown override as ``unknown config option a.b`` (with ml_collections'
      "did you mean" hint within the section, else :func:`suggest_options`' across the
      config: ``train.warmup_steps`` -> ``Did you mean "optim.warmup_steps"?``), a config file
      without ``get_config()`` by the flag and the file, a config file's own error as its last
      traceback line.
    """
    # ml_collections wraps an unknown override as AttributeError(KeyError("'x'\nDid you mean")).
    while error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]
    if isinstance(error, SyntaxError):  # a --<flag>=<file> that is not valid Python
        return describe_syntax_error(error, argv)
    # ml_collections loads --<flag>=<file> as module "<flag>_config" and calls its get_config().
    missing = _NO_GET_CONFIG.fullmatch(str(error).strip()) if isinstance(
        error, AttributeError) else None
    if missing:
        flag = missing.group(1)
        given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{flag}=")]
        path = given[-1].split(":", 1)[0] if given else "the config file"
        return (f"--{flag}={given[-1] if given else '?'}: {path} has no get_config() (a config "
                f"file defines get_config(), returning the experiment's ConfigDict)")
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    if isinstance(error, KeyError):
        key, _, hint = str(text).partition("\n")
        key = key.strip("'\"")
        # Name the whole dotted option as typed (ml_collections reports only the part it did
        # not find: the last, or a section the config lacks, "kda" of model.kda.chunk_size).
        options = [a.split("=", 1)[0][2:] for a in argv if a.startswith("--config.")]
        typed = ([o for o in options if o.endswith("." + key)]
                 or [o for o in options if f".{key}." in o + "."])
        text = f"unknown config option {typed[0][len('config.'):] if typed else key!r}"
        if typed and not typed[0].endswith("." + key):
            parts = typed[0][len("config."):].split(".")
            section = ".".join(parts[:parts.index(key) + 1])
            text += f" (this config has no section {section})"
        if not hint.strip() and typed:
            # ml_collections looks for close names in the option's own section only.
            flag, option = typed[0].split(".", 1)
            near = suggest_options(option, _config_paths(flag, argv, flag_values))
            if near:
                hint = "Did you mean " + _or([f'"{n}"' for n in near]) + "?"
        text += f". {hint.strip()}" if hint.strip() else ""
        extra = unknown_option_hint(key, argv) if unknown_option_hint and not hint.strip() else None
        text += f" ({extra})" if extra else ""
    if "Traceback (most recent call last)" in text:  # config_flags embeds the config's traceback
        head = text.split(":", 1)[0]
        text = f"{head}: {text.strip().splitlines()[-1]}"
    # The traceback's last line starts with the exception's class ("configs.common.ConfigArgError:
    # unknown config argument ..."): the user sees what was wrong, not the class.
    text = _EXCEPTION_PREFIX.sub("", text)
    # absl's and Python's own words for a value of the wrong type, after "flag --x=v: ".
    for pattern, words in _TYPE_ERRORS:
        text = pattern.sub(words, text)
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


# (pattern, replacement) for the type errors a typed override raises while it is parsed.
_TYPE_ERRORS = (
    (re.compile(r"\('Non-boolean argument to boolean flag', '[^']*'\)"),
     "not a boolean (true or false)"),
    (re.compile(r"invalid literal for int\(\) with base 10: '[^']*'"), "not an integer"),
    (re.compile(r"could not convert string to float: '[^']*'"), "not a number"),
)


def suggest_options(option: str, known, limit: int = 3) -> list:
    """Known dotted options close to the unknown ``option``, across every section.

    ml_collections' "did you mean" looks within the option's section only, so
    ``train.warmup_steps`` got no hint of ``optim.warmup_steps`` and ``train.steps`` none of
    ``train.total_steps``.

    Args:
      option: the unknown dotted option as typed, without the flag (``train.steps``).
      known: the config's dotted options (:func:`_config_paths`).
      limit: at most this many.

    Returns:
      Up to ``limit`` options, best first: those with the same last part in another section;
      then those whose last part is a close match of the typed one (a typo in the wrong
      section) or holds all its ``_``-separated words (``steps`` -> ``total_steps``), those of
      the typed section first, then the closest; then close matches of the whole dotted name.
      ``[]`` when none is close.
    """
    known = [k for k in known if k != option]
    section, _, leaf = option.rpartition(".")

    def last(k):
        return k.rpartition(".")[2]

    def own_section_first(keys):  # then the closest last part first
        return sorted(keys, key=lambda k: (k.rpartition(".")[0] != section,
                                           -difflib.SequenceMatcher(None, leaf, last(k)).ratio()))

    words = set(leaf.split("_"))
    close = set(difflib.get_close_matches(leaf, {last(k) for k in known}, n=limit, cutoff=0.8))
    found = [k for k in known if last(k) == leaf]
    found += own_section_first([k for k in known if last(k) in close
                                or words <= set(last(k).split("_"))])
    found += difflib.get_close_matches(option, known, n=limit, cutoff=0.8)
    return list(dict.fromkeys(found))[:limit]


def _config_paths(flag: str, argv, flag_values=None) -> list:
    """The dotted options (sections and fields) of the config that ``--<flag>=<file>`` in
    ``argv`` names, loaded again with the flag's own parser (the failed parse kept none);
    ``[]`` when ``flag`` is no config-file flag or the file cannot be loaded."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{flag}=")]
    if not given or flag not in flag_values:
        return []
    try:
        config = flag_values[flag].parser.parse(given[-1])
    except Exception:  # noqa: BLE001 - no hint then; the error itself is reported
        return []
    paths = []

    def walk(value, prefix):
        for key, item in value.items():
            paths.append(prefix + key)
            if hasattr(item, "items") and not isinstance(item, str):
                walk(item, prefix + key + ".")

    if hasattr(config, "items"):
        walk(config, "")
    return paths


def _or(items) -> str:
    """``"a"``, ``"a or b"``, ``"a, b or c"``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def describe_syntax_error(error: SyntaxError, argv=()) -> str:
    """``cannot load --<flag>=<file>: line N: <what>`` for a config file that is not valid
    Python (ml_collections executes it while parsing the flags), with a note when the file is
    not a ``.py`` file (``--config=README.md``).

    Args:
      error: the ``SyntaxError``; its ``filename`` is the file as given on the command line.
      argv: the command line, to name the flag that gave the file.
    """
    path = error.filename or "?"
    given = [a[2:].split("=", 1)[0] for a in argv if a.startswith("--") and "=" in a
             and a.split("=", 1)[1].split(":", 1)[0] == path]
    flag = given[-1] if given else "config"
    where = f"line {error.lineno}: " if error.lineno else ""
    note = ("" if path.endswith(".py") else
            " (a config file is a Python file defining get_config())")
    return f"cannot load --{flag}={path}: {where}{error.msg}{note}"


def describe_config_load_error(error: OSError, flag: str, path: Optional[str]) -> str:
    """``cannot load --<flag>=<path>: <reason>`` for a config file that cannot be read (no such
    file, a directory, no permission): ml_collections' ``OSError`` reduced to the system's
    reason (``Is a directory``), without its "Configuration is not available because of an
    earlier failure to load" preamble and the file name it repeats.

    Args:
      error: the ``OSError`` that reading the flag's value raised.
      flag: the option, e.g. ``"--config"``.
      path: the file it names (``None``: not known; the flag alone is named).
    """
    reason = str(error).strip().splitlines()[-1].strip()
    reason = reason.split(_EARLIER_FAILURE, 1)[-1].strip()
    bare = _ERRNO.fullmatch(reason)
    if bare and path is not None:
        reason = bare.group(1)
    return f"cannot load {flag}{'=' + path if path is not None else ''}: {reason}"


# ml_collections' OSError for a config file that failed to load, and its errno text.
_EARLIER_FAILURE = "because of an earlier failure to load:"
_ERRNO = re.compile(r"\[Errno \d+\] (.+?): '.*'")

# The AttributeError of a config file without get_config() (ml_collections' module name).
_NO_GET_CONFIG = re.compile(r"module '(\w+)_config' has no attribute 'get_config'")

# "flag --config=x.py: pkg.mod.SomeError: message" -> "flag --config=x.py: message".
_EXCEPTION_PREFIX = re.compile(r"(?:(?<=: )|^)(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): ")


# Printed for a Ctrl-C while a binary starts (jax's imports, the flags): nothing is written yet.
INTERRUPTED_IN_START_UP = "interrupted (Ctrl-C) while starting; nothing was written"


def _exit_on_sigint(signum, frame):
    """The SIGINT handler :func:`exit_on_ctrl_c` installs: one line, status 130, at once."""
    del signum, frame
    os.write(2, (INTERRUPTED_IN_START_UP + "\n").encode())
    os._exit(130)  # the half-imported modules have nothing to save or flush


def exit_on_ctrl_c() -> None:
    """Makes a Ctrl-C end the process at once with one line (:data:`INTERRUPTED_IN_START_UP`)
    and status 130, until :func:`end_exit_on_ctrl_c`. A binary calls it before its heavy
    imports (main thread only, as ``signal.signal`` requires).

    A ``KeyboardInterrupt`` raised inside jax's imports printed a 30-line traceback, became an
    ``ImportError`` ("Encountered an error while initializing the extension"), or was
    swallowed by a garbage-collection callback (``Exception ignored in: _xla_gc_callback``)
    and the run went on as if nothing had happened (experiments/train.py, 2026-12-07).
    """
    signal.signal(signal.SIGINT, _exit_on_sigint)


def end_exit_on_ctrl_c() -> None:
    """Puts Python's ``KeyboardInterrupt`` back for SIGINT where :func:`exit_on_ctrl_c`
    installed its handler (another handler is left alone)."""
    if signal.getsignal(signal.SIGINT) is _exit_on_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
