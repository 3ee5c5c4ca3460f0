"""Shell completion scripts (bash, zsh, fish) generated from an argparse parser.

Why generated: a new command, flag or choice is completed the moment it
exists in the parser, in every shell, for ``steadq`` and ``steadqd`` alike.
Why here and not in ``steadqd.cli``: the daemon's command line needs the same
generator, and the CLI and the daemons may not import each other.

Every program's script is built from one :class:`Tree`: for each command
path (``"put"``, ``"admin purge"``) its options, which of them take a value
and what kind of value, and the kind of each positional argument. Kinds are
``queue`` (a queue: for ``steadq`` a directory, offered from the ``queue:``
lines of the config files; for ``steadqd`` a config name), ``file``,
``dir``, ``words:<a b c>`` or ``none``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh", "fish")
CONFIG_DIR = "${STEADQ_CONFIG_DIR:-/etc/steadq/queues}"

# Metavars whose values are files or directories; every other valued option completes nothing.
_FILE_METAVARS = {"FILE", "TICKET.json", "OUTPUT", "FILE|-"}
_DIR_METAVARS = {"DIR"}


@dataclass
class Command:
    options: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)  # option -> kind of its value
    positionals: list[str] = field(default_factory=list)  # kinds, in order
    subcommands: list[str] = field(default_factory=list)
    rest: str | None = None  # kind of every positional past the last (nargs="*")


@dataclass
class Tree:
    program: str
    queue_is_name: bool  # steadqd: a queue is its config file's name; steadq: its directory
    commands: dict[str, Command]


def _kind(action: argparse.Action, queue_metavars: set[str], metavar_kinds: dict[str, str]) -> str:
    if action.choices:
        return "words:" + " ".join(str(c) for c in action.choices)
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if metavar in metavar_kinds:
        return metavar_kinds[metavar]
    if metavar in queue_metavars:
        return "queue"
    if metavar in _FILE_METAVARS or (not action.option_strings and metavar == "FILE"):
        return "file"
    if metavar in _DIR_METAVARS:
        return "dir"
    return "none"


def build_tree(
    parser: argparse.ArgumentParser,
    program: str,
    *,
    queue_is_name: bool = False,
    anywhere: tuple[str, ...] = (),
    metavar_kinds: dict[str, str] | None = None,
) -> Tree:
    """The completion tree of ``parser`` (``""`` is the top level).

    ``anywhere``: top-level flags the program also accepts after a
    subcommand (``--json``); ``metavar_kinds``: the kind of a value the
    parser does not restrict by ``choices`` (``STATE`` of ``ls``)."""
    queue_metavars = {"QUEUE"} if queue_is_name else {"PATH", "QUEUE"}
    kinds = metavar_kinds or {}
    commands: dict[str, Command] = {}

    def walk(p: argparse.ArgumentParser, key: str) -> None:
        c = commands.setdefault(key, Command())
        for action in p._actions:  # noqa: SLF001 - argparse has no public introspection
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for name, sp in action.choices.items():
                    c.subcommands.append(name)
                    walk(sp, f"{key} {name}".strip())
            elif action.option_strings:
                longs = [o for o in action.option_strings if o.startswith("--")]
                c.options += longs
                if action.nargs != 0:
                    for o in longs:
                        c.values[o] = _kind(action, queue_metavars, kinds)
            elif action.nargs in ("*", "+"):
                c.rest = _kind(action, queue_metavars, kinds)
            else:
                c.positionals.append(_kind(action, queue_metavars, kinds))
        if key:
            c.options += [o for o in anywhere if o not in c.options]

    walk(parser, "")
    return Tree(program, queue_is_name, commands)


def script(shell: str, tree: Tree) -> str:
    """The completion script for ``shell``; ValueError for a shell we do not write."""
    if shell == "bash":
        return _bash(tree)
    if shell == "zsh":
        return _zsh(tree)
    if shell == "fish":
        return _fish(tree)
    raise ValueError(f"no completion for shell {shell!r}: choose one of {', '.join(SHELLS)}")


def _fn(tree: Tree) -> str:
    return "_" + tree.program.replace("-", "_")


def _queues_sh(tree: Tree) -> str:
    """A POSIX-shell pipeline (bash and zsh) printing the configured queues, one a line."""
    if tree.queue_is_name:
        return f'for f in "{CONFIG_DIR}"/*.yaml; do [ -e "$f" ] && {{ f=${{f##*/}}; echo "${{f%.yaml}}"; }}; done'
    return f"sed -n 's/^queue:[[:space:]]*//p' \"{CONFIG_DIR}\"/*.yaml 2>/dev/null"


def _sh_state(tree: Tree, fn: str) -> str:
    """Shared bash/zsh function body: sets ``cmd`` (command path) and ``pos`` (positional index).

    Words are ``words[1..cword-1]``; an option that takes a value skips the
    next word, so ``--handle-file h.json`` is not a positional."""
    groups = " ".join(k for k, c in tree.commands.items() if c.subcommands and k)
    valued = "\n".join(
        f'        "{k}") valued=" {" ".join(sorted(c.values))} " ;;' for k, c in sorted(tree.commands.items())
    )
    return f"""{fn}_state() {{
    # usage: {fn}_state WORD...   (the words before the one being completed, program excluded)
    cmd="" pos=0 after_dashes=0
    local w valued skip=0
    for w in "$@"; do
        if (( skip )); then skip=0; continue; fi
        if (( after_dashes )); then pos=$((pos + 1)); continue; fi
        case "$cmd" in
{valued}
        esac
        case "$w" in
            --) after_dashes=1 ;;
            --*=*) ;;
            -*) [[ "$valued" == *" $w "* ]] && skip=1 ;;
            *) if [[ -z "$cmd" ]]; then cmd="$w"
               elif [[ " {groups} " == *" $cmd "* ]]; then cmd="$cmd $w"
               else pos=$((pos + 1)); fi ;;
        esac
    done
}}"""


def _sh_kinds(tree: Tree) -> tuple[str, str]:
    """(case arms: positional kind by "cmd:pos", case arms: value kind by "cmd:option")."""
    pos_arms, val_arms = [], []
    for k, c in sorted(tree.commands.items()):
        kinds = list(c.positionals)
        if c.subcommands:
            kinds = ["words:" + " ".join(c.subcommands)]
        for i, kind in enumerate(kinds):
            pos_arms.append(f'        "{k}:{i}") kind="{kind}" ;;')
        if c.rest is not None:
            pos_arms.append(f'        "{k}:"*) kind="{c.rest}" ;;')
        for opt, kind in sorted(c.values.items()):
            val_arms.append(f'        "{k}:{opt}") kind="{kind}" ;;')
    return "\n".join(pos_arms), "\n".join(val_arms)


def _sh_opts(tree: Tree) -> str:
    return "\n".join(f'        "{k}") opts="{" ".join(c.options)}" ;;' for k, c in sorted(tree.commands.items()))


def _sh_decide(tree: Tree, reply_options: str) -> str:
    """The part of the bash and zsh functions that decides what is completed (``kind``), shared by both.

    ``reply_options`` is the shell's own way to offer ``$opts`` when the word starts with a dash.
    """
    pos_arms, val_arms = _sh_kinds(tree)
    return f"""    case "$cmd:$prev" in
{val_arms}
    esac
    if [[ -z "$kind" ]]; then
        if [[ "$cur" == -* ]]; then
            case "$cmd" in
{_sh_opts(tree)}
            esac
            {reply_options}
        fi
        case "$cmd:$pos" in
{pos_arms}
        esac
        [[ -z "$cmd" ]] && kind="words:{" ".join(tree.commands[""].subcommands)}"
    fi"""


def _bash(tree: Tree) -> str:
    fn = _fn(tree)
    return f"""# bash completion for {tree.program}; enable with: source <({tree.program} completion bash)
# (installed packages put it in /usr/share/bash-completion/completions/{tree.program})
{_sh_state(tree, fn)}

{fn}() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" cmd pos after_dashes kind="" opts=""
    {fn}_state "${{COMP_WORDS[@]:1:COMP_CWORD-1}}"
    if (( after_dashes )); then COMPREPLY=($(compgen -c -- "$cur")); return; fi
{_sh_decide(tree, 'COMPREPLY=($(compgen -W "$opts" -- "$cur")); return')}
    case "$kind" in
        words:*) COMPREPLY=($(compgen -W "${{kind#words:}}" -- "$cur")) ;;
        queue) local IFS=$'\\n'; COMPREPLY=($(compgen -W "$({_queues_sh(tree)})" -- "$cur")
               {"" if tree.queue_is_name else '$(compgen -d -- "$cur")'}) ;;
        file) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")) ;;
        dir) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur")) ;;
        *) COMPREPLY=() ;;
    esac
}}
complete -F {fn} {tree.program}
"""


def _zsh(tree: Tree) -> str:
    fn = _fn(tree)
    queue_extra = "" if tree.queue_is_name else "; _directories"
    return f"""#compdef {tree.program}
# zsh completion for {tree.program}; enable with: source <({tree.program} completion zsh) (after compinit),
# or install it as _{tree.program} in a directory of $fpath
{_sh_state(tree, fn)}

{fn}() {{
    local cur="${{words[CURRENT]}}" prev="${{words[CURRENT-1]}}" cmd pos after_dashes kind="" opts=""
    {fn}_state "${{(@)words[2,CURRENT-1]}}"
    if (( after_dashes )); then _command_names; return; fi
{_sh_decide(tree, "compadd -- ${=opts}; return")}
    case "$kind" in
        words:*) compadd -- ${{=kind#words:}} ;;
        queue) compadd -- ${{(f)"$({_queues_sh(tree)})"}}{queue_extra} ;;
        file) _files ;;
        dir) _directories ;;
    esac
}}
if [[ "${{funcstack[1]}}" == _{tree.program} ]]; then {fn} "$@"; else compdef {fn} {tree.program}; fi
"""


def _fish(tree: Tree) -> str:
    fn = "__" + tree.program.replace("-", "_")
    groups = " ".join(k for k, c in tree.commands.items() if c.subcommands and k)
    lines = [
        f"# fish completion for {tree.program}; enable with: {tree.program} completion fish | source",
        f"# (installed packages put it in /usr/share/fish/vendor_completions.d/{tree.program}.fish)",
        f"function {fn}_state --description 'the command path and positional index before the cursor'",
        "    set -l words (commandline -opc)[2..-1]",
        "    set -l cmd ''",
        "    set -l pos 0",
        "    set -l skip 0",
        "    for w in $words",
        "        if test $skip = 1; set skip 0; continue; end",
        "        if test \"$pos\" = '--'; continue; end",
        "        switch $w",
        "            case '--'",
        # the name before the value: `set pos -- '--'` stores both words, and the state never matches
        "                set -- pos '--'",
        "            case '--*=*'",
        "            case '-*'",
        f"                if contains -- $w ({fn}_valued $cmd); set skip 1; end",
        "            case '*'",
        '                if test -z "$cmd"; set cmd $w',
        f'                else if contains -- $cmd {groups}; set cmd "$cmd $w"',
        "                else; set pos (math $pos + 1); end",
        "        end",
        "    end",
        '    echo "$cmd:$pos"',
        "end",
        f"function {fn}_valued",
        '    switch "$argv"',
    ]
    for k, c in sorted(tree.commands.items()):
        if c.values:
            lines.append(f"        case '{k}'")
            lines.append(f"            printf '%s\\n' {' '.join(sorted(c.values))}")
    lines += ["    end", "end", f"function {fn}_queues"]
    if tree.queue_is_name:
        lines += [
            "    for f in (set -q STEADQ_CONFIG_DIR; and echo $STEADQ_CONFIG_DIR; or echo /etc/steadq/queues)/*.yaml",
            "        basename $f .yaml",
            "    end",
        ]
    else:
        lines += [
            "    set -l d (set -q STEADQ_CONFIG_DIR; and echo $STEADQ_CONFIG_DIR; or echo /etc/steadq/queues)",
            "    set -l files $d/*.yaml  # set, unlike a command, accepts a glob that matches nothing",
            "    test (count $files) -gt 0; and sed -n 's/^queue:[[:space:]]*//p' $files 2>/dev/null",
        ]
    lines += ["end", f"complete -c {tree.program} -f"]

    def action(kind: str) -> str:
        if kind.startswith("words:"):
            return f"-a '{kind.removeprefix('words:')}'"
        if kind == "queue":
            return f"-a '({fn}_queues)'" if tree.queue_is_name else f"-a '({fn}_queues; __fish_complete_directories)'"
        if kind == "file":
            return "-F"
        if kind == "dir":
            return "-a '(__fish_complete_directories)'"
        return "-x"

    # Past a `--` the state's position is `--`: what follows is the job's command line, so command
    # names are offered there (as bash and zsh do) and nothing of the program's own.
    lines.append(
        f"complete -c {tree.program} -n 'string match -q -- \"*:--\" ({fn}_state)' -a '(__fish_complete_command)'"
    )
    for k, c in sorted(tree.commands.items()):
        kinds = ["words:" + " ".join(c.subcommands)] if c.subcommands else list(c.positionals)
        for i, kind in enumerate(kinds):
            if kind != "none":
                lines.append(f"complete -c {tree.program} -n 'test ({fn}_state) = \"{k}:{i}\"' {action(kind)}")
        cond = f"string match -qr -- '^{k}:[0-9]' ({fn}_state)"
        if c.rest not in (None, "none") and not kinds:
            lines.append(f'complete -c {tree.program} -n "{cond}" {action(c.rest)}')
        for opt in c.options:
            value = f" -r {action(c.values[opt])}" if opt in c.values else ""
            lines.append(f'complete -c {tree.program} -n "{cond}" -l {opt.removeprefix("--")}{value}')
    return "\n".join(lines) + "\n"
