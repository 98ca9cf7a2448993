"""The ``flowgrpo`` command line (grows with the trainer, replay and report).

Each subcommand is added by an ``add_<name>_parser(subparsers)`` function that sets ``func`` (the
handler, ``args -> exit code``); handlers import their modules lazily so ``flowgrpo --help`` stays
fast.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from typing import NoReturn


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr (exit 2) that names the fix, not a usage block:
    an unknown option gets the closest valid one, and ``--help`` stays the place for the full list."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(low: int, what: str = "a count"):
    """An argparse ``type`` for integers >= ``low`` (``--n 0`` or ``--n -3`` is a mistake, not a
    request to evaluate every task, or all but three)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer ({what})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low} ({what} of at least {low})")
        return value

    return parse


def _port(text: str) -> int:
    port = _count(0, "a TCP port")(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0-65535; 0 picks a free one)")
    return port


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object, e.g. '{{\"difficulty\": 2}}'")
    return value


def _unknown_options(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments`` with the closest valid option of the subcommand for each."""
    import difflib

    known = [s for a in parser._actions for s in a.option_strings]
    parts = []
    for arg in extras:
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag.replace("_", "-"), known, n=1, cutoff=0.6)
        parts.append(f"{arg} (did you mean {close[0]}?)" if close and flag.startswith("-") else arg)
    return f"unrecognized arguments: {' '.join(parts)}"


def _first_line(text: str | None) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def add_replay_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay",
        help="print a run's trajectories turn by turn; rescore or re-execute them",
        description="Print saved trajectories turn by turn (messages, tool calls, observations, per-turn "
        "reward/advantage, token counts, termination, reward breakdown). --rescore scores them with other "
        "rewards; --reexecute runs the recorded tool calls again and reports differing observations.",
    )
    p.add_argument("run", help="the run directory (the trainer's output_dir)")
    p.add_argument("--step", type=int, help="optimizer step (default: the last saved step)")
    p.add_argument("--task", help="only trajectories of this task id")
    p.add_argument("--traj", help="the K-th trajectory of the selection, or a trajectory id")
    p.add_argument(
        "--limit", type=_count(0), default=4, help="print at most this many trajectories in full (default 4)"
    )
    p.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="ANSI colour (auto: only when stdout is a terminal)",
    )
    p.add_argument(
        "--no-tokenizer",
        action="store_true",
        help="do not load the run's tokenizer (the opening prompt is then shown as a token count)",
    )
    p.add_argument(
        "--rescore",
        nargs="+",
        metavar="REWARD",
        help="score the selection with these rewards (NAME or NAME=WEIGHT), e.g. accuracy format=0.2",
    )
    p.add_argument(
        "--reexecute",
        action="store_true",
        help="run the recorded tool calls against the environment and report differing observations",
    )
    p.add_argument("--env", help="environment name (default: the run's config.yaml)")
    p.add_argument(
        "--env-kwargs", type=_json_object, help="environment kwargs as a JSON object (default: the config's)"
    )
    p.set_defaults(func=_run_replay)


def _run_replay(args: argparse.Namespace) -> int:
    from flowgrpo.runs.replay import cli_replay

    return cli_replay(args)


def add_report_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="write RUN/report.html (curves, tables, token-level trajectories) and RUN/plot.png",
        description="Write a static, self-contained HTML report of a run: reward and accuracy curves, "
        "per-step metrics, evaluations, and trajectories with tokens coloured by loss mask and advantage.",
    )
    p.add_argument("run", help="the run directory")
    p.add_argument("-o", "--output", help="output HTML path (default RUN/report.html)")
    p.add_argument("--max-trajectories", type=_count(0), default=8, help="trajectories shown (default 8)")
    p.add_argument(
        "--step",
        type=int,
        action="append",
        help="steps whose trajectories to show (repeatable; default: the first and last)",
    )
    p.add_argument(
        "--no-tokenizer", action="store_true", help="show token ids instead of loading the tokenizer"
    )
    p.add_argument("--no-plot", action="store_true", help="do not write RUN/plot.png")
    p.set_defaults(func=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from flowgrpo.runs.report import cli_report

    return cli_report(args)


def add_envs_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("envs", help="list the registered environments and their tools")
    p.set_defaults(func=_run_envs)


def _run_envs(args: argparse.Namespace) -> int:
    from flowgrpo import env as env_mod

    names = env_mod.list_envs()
    if not names:
        print("no environments registered")
        return 0
    width = max(len(n) for n in names)
    for name in names:
        try:
            env = env_mod.make(name)
        except Exception as e:  # a plugin that fails to import still gets listed, with the reason
            print(f"{name:<{width}}  (cannot be built with default arguments: {type(e).__name__}: {e})")
            continue
        doc = _first_line(type(env).__doc__) or _first_line(env.system_prompt)
        tools = ", ".join(t.name for t in env.tools) or "(none)"
        print(f"{name:<{width}}  {doc}")
        print(f"{'':<{width}}  tools: {tools}")
    return 0


def add_tools_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tools", help="list the registered tools")
    p.set_defaults(func=_run_tools)


def _run_tools(args: argparse.Namespace) -> int:
    from flowgrpo import tool as tool_mod

    names = tool_mod.list_tools()
    if not names:
        print("no tools registered")
        return 0
    width = max(len(n) for n in names)
    for name in names:
        try:
            t = tool_mod.make_tool(name)
        except ImportError as e:
            print(f"{name:<{width}}  (cannot be imported: {_first_line(str(e))})")
            continue
        except Exception as e:  # e.g. search needs a corpus: list it with the reason
            print(f"{name:<{width}}  (needs arguments to build: {_first_line(str(e))})")
            continue
        args_desc = ", ".join(
            sorted(tool_mod.to_openai_schema(t)["function"]["parameters"].get("properties", {}))
        )
        print(f"{name:<{width}}  {_first_line(t.description)}  (args: {args_desc or 'none'})")
    return 0


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.lr=1e-5 --set rollout.max_turns=3 (repeatable)",
    )


def _load(config: str, overrides: list[str]):
    """A TrainConfig from a YAML file or a run directory (its config.yaml), plus overrides. A bad
    config exits with code 2 and the message that says how to fix it, as argparse does for bad flags."""
    from pathlib import Path

    from flowgrpo.config import ConfigError, load_config
    from flowgrpo.runs.rundir import RunDir, RunError

    path = Path(config)
    try:
        if path.is_dir():
            return RunDir(path).config(overrides)
        return load_config(path, overrides)
    except (ConfigError, RunError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        raise SystemExit(2) from None


def add_train_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a policy: held-out eval, (warm start), Flow-GRPO steps, held-out eval, plot + report",
        description="Run the main job for CONFIG (YAML): evaluate the untrained policy on held-out tasks, "
        "train (optional supervised warm start on oracle demonstrations, then Flow-GRPO), evaluate again, "
        "and write RUN/{metrics,eval}.jsonl, trajectories, checkpoints, plot.png and report.html. "
        "Ctrl-C checkpoints and stops; run again with --set run.resume=true to continue.",
    )
    p.add_argument("config", nargs="?", help="YAML config file (see examples/) or an existing run directory")
    _config_args(p)
    debug = p.add_argument_group(
        "debug modes", "separate sampling problems from optimisation problems (docs/learning.md)"
    )
    debug.add_argument(
        "--rollout-only",
        action="store_true",
        help="roll out, score and save one step's trajectories (RUN/trajectories/step_N.jsonl), no update",
    )
    debug.add_argument(
        "--update-only",
        metavar="RUN",
        help="replay the trajectories RUN saved at --step N into one update from the policy that "
        "sampled them and print the loss terms beside the recorded ones (writes nothing into RUN)",
    )
    debug.add_argument("--step", type=int, help="with --update-only: the saved step to replay")
    p.add_argument(
        "--eval-n",
        type=_count(0),
        default=100,
        help="held-out tasks evaluated after the warm start and after RL (0: skip)",
    )
    p.add_argument(
        "--untrained-n",
        type=_count(0),
        help="held-out tasks evaluated before training (default: --eval-n; 0: none)",
    )
    p.add_argument("--no-report", action="store_true", help="skip plot.png and report.html")
    p.set_defaults(func=_run_train)


def _train_mode_error(args: argparse.Namespace) -> str | None:
    if args.update_only is not None:
        if args.config is not None:
            return "--update-only RUN takes no CONFIG (the run's config.yaml is used; change it with --set)"
        if args.rollout_only:
            return "--rollout-only and --update-only are separate runs: pass one of them"
        if args.step is None:
            return "--update-only needs --step N, the saved step to replay (see RUN/trajectories/)"
        return None
    if args.step is not None:
        return "--step belongs to --update-only RUN --step N"
    if args.config is None:
        return "train needs a CONFIG (a YAML file or a run directory), or --update-only RUN --step N"
    return None


def _run_train(args: argparse.Namespace) -> int:
    if (problem := _train_mode_error(args)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.update_only is not None:
        from flowgrpo.training.debug import update_only

        print(update_only(args.update_only, args.step, args.overrides).summary())
        return 0
    cfg = _load(args.config, args.overrides)
    if args.rollout_only:
        from flowgrpo.training.debug import rollout_only
        from flowgrpo.training.trainer import Trainer

        print(rollout_only(Trainer(cfg)).summary())
        return 0
    from flowgrpo.training.pipeline import train_and_evaluate

    out = train_and_evaluate(
        cfg, eval_n=args.eval_n or None, untrained_n=args.untrained_n, report=not args.no_report
    )
    return 0 if out["train"].get("status") in ("finished", "interrupted") else 1


def add_eval_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a run's checkpoint (or a config's untrained model); compare two checkpoints",
        description="Accuracy with n and a 95%% interval (Wilson), mean turns, valid tool-call rate and "
        "terminations on N tasks of a split: one greedy episode per task, or --samples K sampled episodes "
        "with pass@k (k = 1, 2, 4, 8). --compare A B evaluates two checkpoints of a run (a step number, "
        "'warm' or 'untrained') on the same tasks and prints the paired difference, its interval and "
        "the exact McNemar p-value (recorded evaluations in RUN/eval.jsonl are reused).",
    )
    p.add_argument(
        "config",
        help="a run directory (its latest checkpoint), an exported model directory (flowgrpo export), "
        "or a YAML config (untrained model)",
    )
    _config_args(p)
    p.add_argument("--split", choices=["train", "test"], default="test")
    p.add_argument("--n", type=_count(1), default=500, help="number of tasks (default 500)")
    p.add_argument(
        "--samples",
        type=_count(0),
        default=0,
        help="sample K episodes per task at the config's temperature (pass@k) instead of one greedy one",
    )
    p.add_argument("--checkpoint", help="a checkpoint directory (default: the run's latest)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two checkpoints: STEP, warm or untrained")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_run_eval)


EVAL_ACCEPTS = (
    "eval takes a run directory (the trainer's run.output_dir: its latest checkpoint, or --checkpoint "
    "DIR), a model directory (flowgrpo export RUN OUT, or a local Hugging Face model), or a YAML config "
    "(its untrained model)"
)


def _eval_target_error(target: str) -> str | None:
    """Why ``target`` is nothing ``eval`` takes, or None. A checkpoint directory gets the command
    that evaluates it."""
    from pathlib import Path

    from flowgrpo.runs.checkpoint import STATE_FILE

    p = Path(target)
    if not p.exists():
        return f"no run directory, model directory, checkpoint or config file at {target}: {EVAL_ACCEPTS}"
    if p.is_dir() and (p / STATE_FILE).is_file():
        run = p.parent.parent if p.parent.name == "checkpoints" else None
        how = f"flowgrpo eval {run} --checkpoint {p}" if run else f"flowgrpo eval RUN --checkpoint {p}"
        return f"{target} is a checkpoint, not a run: evaluate it with {how}"
    if p.is_dir() and not (p / "config.yaml").is_file() and not _is_model_dir(target):
        return f"{target} is neither a run directory (no config.yaml) nor a model directory (no config.json): {EVAL_ACCEPTS}"
    return None


def _run_eval(args: argparse.Namespace) -> int:
    from flowgrpo.runs.export import exported_config, is_run_dir
    from flowgrpo.training.pipeline import compare_checkpoints, evaluate_run

    if (problem := _eval_target_error(args.config)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if _is_model_dir(args.config) and not is_run_dir(args.config):
        # an exported (or any local HF) model directory: its own flowgrpo.yaml, or the defaults
        cfg = exported_config(args.config, args.overrides)
        args.checkpoint = "untrained"
    else:
        cfg = _load(args.config, args.overrides)
    if args.compare:
        a, b = args.compare
        try:
            out = compare_checkpoints(cfg, a, b, split=args.split, n=args.n)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        cmp = out["comparison"]
        if args.json:
            print(
                json.dumps(
                    {
                        "a": out["a"].model_dump(exclude={"per_task"}),
                        "b": out["b"].model_dump(exclude={"per_task"}),
                        "comparison": cmp.model_dump(),
                    }
                )
            )
        else:
            print(out["a"].summary())
            print(out["b"].summary())
            print(cmp.summary(a, b))
        return 0
    rec = evaluate_run(
        cfg,
        split=args.split,
        n=args.n,
        greedy=args.samples == 0,
        samples=max(args.samples, 1),
        checkpoint=args.checkpoint,
    )
    print(rec.model_dump_json(exclude={"per_task"}) if args.json else rec.summary())
    return 0


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (/v1/models, /v1/completions, /v1/chat/completions)",
        description="Serve a model with the hf backend over an OpenAI-compatible API (vLLM dialect: token-id "
        "prompts, token ids and processed logprobs in completions; tools and tool_calls in chat). No streaming; "
        "docs/gateway.md.",
    )
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="a run directory (its latest checkpoint, or --step), an exported or other local HF "
        "directory, an embedded model name, a .gguf file, or 'tiny' (a random test model)",
    )
    p.add_argument("--step", type=int, help="with a run directory: serve this step's checkpoint")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (0 picks a free one; default 8000)")
    p.add_argument(
        "--autocast", choices=["bfloat16", "float16"], help="decode under autocast over fp32 weights"
    )
    p.add_argument(
        "--max-batch-size", type=_count(1), default=64, help="prompts decoded together (default 64)"
    )
    p.add_argument("--served-model-name", help="the model id clients use (default: --model)")
    p.add_argument(
        "--api-key-env",
        help="name of an environment variable holding a key: every request must then send "
        "'Authorization: Bearer <key>' (default: no key; the server binds loopback)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=_count(1),
        default=8 * 2**20,
        help="larger request bodies get a 413 (default 8 MiB)",
    )
    p.add_argument(
        "--record",
        metavar="RUN_DIR",
        help="record agent episodes (requests with an episode id: X-Episode-Id, 'user', or /episodes/ID/v1) "
        "as trajectories in RUN_DIR/trajectories/ (docs/gateway.md)",
    )
    p.add_argument("--max-episode-turns", type=_count(1), default=64, help="model calls per recorded episode")
    p.add_argument(
        "--max-episode-tokens", type=_count(1), default=8192, help="context tokens of a recorded episode"
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda when there is a GPU, else cpu), cpu, cuda or cuda:N"
    )
    p.set_defaults(func=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from flowgrpo.gateway.serve import main as serve_main

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise SystemExit(
                f"--api-key-env {args.api_key_env}: that environment variable is not set or empty"
            )
    return serve_main(
        args.model,
        step=args.step,
        host=args.host,
        port=args.port,
        autocast=args.autocast,
        max_batch_size=args.max_batch_size,
        model_name=args.served_model_name,
        api_key=api_key,
        max_request_bytes=args.max_request_bytes,
        record=args.record,
        max_episode_turns=args.max_episode_turns,
        max_episode_tokens=args.max_episode_tokens,
        device=args.device,
    )


def add_export_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a run's checkpoint as a Hugging Face model directory (safetensors + tokenizer)",
        description="Write RUN's latest checkpoint (or --step N) to OUT as a save_pretrained directory: "
        "safetensors weights, config, tokenizer and chat template (LoRA policies merged). "
        "transformers.AutoModelForCausalLM.from_pretrained(OUT) loads it; flowgrpo serve --model OUT "
        "and flowgrpo eval OUT use it.",
    )
    p.add_argument("run", help="the run directory")
    p.add_argument("out", help="the directory to write (replaced if it exists)")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")
    p.add_argument(
        "--device",
        default="auto",
        help="where the policy is rebuilt and merged: auto (default), cpu, cuda or cuda:N; the files are the same",
    )
    p.set_defaults(func=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from flowgrpo.runs.export import export_checkpoint, is_run_dir

    if not is_run_dir(args.run):
        print(f"error: {args.run} is not a run directory (no config.yaml and checkpoints/)", file=sys.stderr)
        return 2
    out = export_checkpoint(args.run, args.out, step=args.step, device=args.device)
    print(f"exported to {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


def _is_model_dir(path: str) -> bool:
    from pathlib import Path

    return (Path(path) / "config.json").is_file()


_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}


def _user_error(e: Exception) -> bool:
    """Errors whose message says how to fix the input: printed as one line, exit 2 (no traceback)."""
    from flowgrpo.config import ConfigError
    from flowgrpo.modeling.models import ModelLoadError
    from flowgrpo.runs.checkpoint import CheckpointError, MissingCheckpointError
    from flowgrpo.runs.rundir import RunError
    from flowgrpo.utils.plugins import MissingExtraError, PluginError

    return isinstance(
        e,
        (
            CheckpointError,
            ConfigError,
            MissingCheckpointError,
            MissingExtraError,
            ModelLoadError,
            PluginError,
            RunError,
        ),
    )


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record, not the stream it was
    created with (which a caller running main() twice, or a test capture, may have closed)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _console_logging() -> None:
    """flowgrpo's own INFO messages on stderr (model loads, checkpoint writes, warnings): a long
    phase never runs silently. Libraries keep their own levels."""
    import logging

    logger = logging.getLogger("flowgrpo")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s flowgrpo: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="flowgrpo", description=_first_line(__doc__))
    subparsers = parser.add_subparsers(dest="command")  # the subcommands' parsers are _Parser too
    add_train_parser(subparsers)
    add_eval_parser(subparsers)
    add_replay_parser(subparsers)
    add_report_parser(subparsers)
    add_envs_parser(subparsers)
    add_tools_parser(subparsers)
    add_serve_parser(subparsers)
    add_export_parser(subparsers)
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = subparsers.choices.get(args.command) if args.command else None
        (sub or parser).error(_unknown_options(sub or parser, extras))
    if args.command is None:
        parser.print_help()
        return 0
    _console_logging()
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `flowgrpo replay RUN | head`
        sys.stderr.close()
        return 0
    except Exception as e:
        if _user_error(e):
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        if not isinstance(e, OSError) or e.errno not in _DISK_ERRNOS:
            raise
        # a full disk, a read-only or forbidden output directory: the path and the errno, one line
        where = e.filename or "the output directory"
        print(f"error: cannot write {where}: [Errno {e.errno}] {e.strerror}", file=sys.stderr)
        return 2
