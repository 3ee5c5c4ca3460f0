"""``steadq completion bash|zsh``: a shell completion script, generated from the parser itself.

Generated rather than written by hand so that a new command or flag is
completed the moment it exists; ``main`` hands the command the parser it
parsed with (``args.parser``).
"""

from __future__ import annotations

import argparse
import sys

from steadqd.cli.common import Subcommands, add_command


def add_completion(sub: Subcommands) -> None:
    s = add_command(sub, "completion", "print a shell completion script", "source <(steadq completion bash)")
    s.add_argument("shell", choices=("bash", "zsh"))
    s.set_defaults(run=cmd_completion)


def _command_tree(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """``{"put": [options...], "admin dead-list": [...], ...}`` from the parser itself."""
    tree: dict[str, list[str]] = {}

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for action in p._actions:  # noqa: SLF001 - argparse has no public introspection
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                for name, sp in action.choices.items():
                    key = f"{prefix} {name}".strip()
                    longs = {o for act in sp._actions for o in act.option_strings if o.startswith("--")}  # noqa: SLF001
                    tree[key] = sorted(longs | {"--json"})
                    walk(sp, key)

    walk(parser, "")
    return tree


def _join(words: list[str]) -> str:
    return " ".join(words)


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The bash or zsh completion script for the command tree of ``parser``."""
    tree = _command_tree(parser)
    top = " ".join(sorted(k for k in tree if " " not in k))
    admin_cmds = " ".join(sorted(k.split(" ", 1)[1] for k in tree if k.startswith("admin ")))
    if shell == "bash":
        cases = "\n".join(f'        "{k}") opts="{_join(v)}" ;;' for k, v in sorted(tree.items()))
        return f"""# bash completion for steadq; enable with: source <(steadq completion bash)
_steadq() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" i opts=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) ;;
            *) if [[ -z "$cmd" ]]; then cmd="${{COMP_WORDS[i]}}"
               elif [[ "$cmd" == admin && "$cmd" != *" "* ]]; then cmd="admin ${{COMP_WORDS[i]}}"; fi ;;
        esac
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "{top} --json --help" -- "$cur")); return
    fi
    if [[ "$cmd" == admin ]]; then
        COMPREPLY=($(compgen -W "{admin_cmds}" -- "$cur")); return
    fi
    if [[ "$cmd" == completion ]]; then
        COMPREPLY=($(compgen -W "bash zsh" -- "$cur")); return
    fi
    case "$cmd" in
{cases}
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts --help" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _steadq steadq
"""
    cases = "\n".join(f'    "{k}") opts=({_join(v)}) ;;' for k, v in sorted(tree.items()))
    return f"""#compdef steadq
# zsh completion for steadq; enable with: source <(steadq completion zsh)  (after compinit)
_steadq() {{
  local -a words_ cmds admin_cmds opts
  cmds=({top})
  admin_cmds=({admin_cmds})
  words_=(${{words[2,CURRENT-1]:#-*}})
  if (( ${{#words_}} == 0 )); then
    compadd -- $cmds --json --help; return
  fi
  local cmd=${{words_[1]}}
  if [[ $cmd == admin ]]; then
    if (( ${{#words_}} == 1 )); then compadd -- $admin_cmds; return; fi
    cmd="admin ${{words_[2]}}"
  fi
  if [[ $cmd == completion ]]; then compadd -- bash zsh; return; fi
  case $cmd in
{cases}
  esac
  if [[ $PREFIX == -* ]]; then compadd -- $opts --help; else _files; fi
}}
compdef _steadq steadq
"""


def cmd_completion(a: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(a.shell, a.parser))
    sys.stdout.flush()
    return 0


COMMANDS = {"completion": add_completion}
