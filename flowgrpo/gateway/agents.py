"""Rollouts of agent programs the project does not own: ``rollout.source: gateway``.

The trainer serves its own policy through the gateway (in process, on a loopback port, with a
fresh bearer token) and runs the configured agent program once per episode, ``group_size`` times
per task, each as a process of its own with its episode in the environment
(:data:`flowgrpo.gateway.client.ENV_VARS`): its model calls go to
``/episodes/EPISODE_ID/v1`` and are recorded token-exactly (:mod:`flowgrpo.gateway.recorder`), and
it posts its reward when done. The trainer waits for every episode, then computes advantages and
updates as usual; before the next rollout it tells the gateway the new policy version (the served
model is the trainer's model object, so the weights are already the new ones).

An agent program that crashes (non-zero exit without a reward), exits without posting a reward, or
runs past ``timeout_s`` (killed, with its process group) ends only its own episode: termination
``error``, the reason in ``metadata["error"]``, and ``excluded`` set, so it is left out of the
update and out of its group's baseline (docs/algorithms.md, "Excluded episodes").

Why processes: agent code is arbitrary (its own event loop, threads, globals, crashes); a process
per episode isolates one episode's failure and lets the programs run side by side while their
requests meet in the hf backend's running batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from flowgrpo.gateway.app import PolicyServer, make_server, serve_in_thread
from flowgrpo.gateway.recorder import EpisodeRecorder, RecorderLimits
from flowgrpo.rollout.backends.base import RolloutBackend
from flowgrpo.rollout.engine import GatewayAgentConfig, RolloutConfig
from flowgrpo.types import Task, Termination, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

_TAIL = 2000  # characters of an agent program's output kept for a failed episode


class GatewayRollout:
    """The gateway plus the agent programs: groups of episodes for the trainer.

    Args:
        backend: the policy's backend (the trainer's hf backend: it samples the trainer's model).
        tokenizer: the policy's tokenizer.
        config: the run's rollout settings (limits of an episode; ``sampling`` is imposed on every
            recorded request, so the logprobs are those the trainer scores under).
        agent: the agent program (``rollout.gateway``).
    """

    def __init__(
        self, backend: RolloutBackend, tokenizer: Any, config: RolloutConfig, agent: GatewayAgentConfig
    ) -> None:
        self.agent = agent
        self.config = config
        self.api_key = secrets.token_hex(16)
        limits = RecorderLimits(
            max_turns=config.max_turns,
            max_context_tokens=config.max_context_tokens,
            max_new_tokens=config.max_new_tokens,
        )
        self.recorder = EpisodeRecorder(None, limits)
        self.server: PolicyServer = make_server(
            backend,
            tokenizer,
            model_name="policy",
            api_key=self.api_key,
            recorder=self.recorder,
            sampling=config.sampling,
        )
        serve_in_thread(self.server)
        log.info("gateway for agent programs at %s", self.server.url)

    @property
    def url(self) -> str:
        return self.server.url

    def set_policy_version(self, version: int) -> None:
        """The trainer's weights changed in place: requests from now on report ``version`` (a
        request in flight finishes first) and cached prefixes of the old weights are dropped."""
        self.server.call_soon(self.server.set_policy_version(version), timeout=60)

    def run_groups(
        self, tasks: Sequence[Task], group_size: int, *, policy_version: int
    ) -> list[TrajectoryGroup]:
        """``group_size`` episodes of the agent program per task, all started together (at most
        ``max_concurrency`` programs at once); one group per task, in order."""
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        if self.server.policy_version != policy_version:
            self.set_policy_version(policy_version)
        groups = [TrajectoryGroup(task=t) for t in tasks]
        return asyncio.run(self._run(groups, group_size))

    async def _run(self, groups: list[TrajectoryGroup], group_size: int) -> list[TrajectoryGroup]:
        slots = asyncio.Semaphore(self.agent.max_concurrency)
        jobs = []
        for g in groups:
            for i in range(group_size):
                episode_id = f"{g.group_id}-{i}"
                self.recorder.open(episode_id, task_id=g.task.id, group_id=g.group_id, env="gateway")
                jobs.append(self._episode(episode_id, g.task, slots))
        trajs = await asyncio.gather(*jobs)
        for k, g in enumerate(groups):
            g.trajectories = list(trajs[k * group_size : (k + 1) * group_size])
        self.recorder.forget([t.id for t in trajs])
        return groups

    def _environment(self, episode_id: str, task: Task) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.agent.env)
        env.update(
            {
                "FLOWGRPO_GATEWAY_URL": self.server.url,
                "FLOWGRPO_EPISODE_ID": episode_id,
                "FLOWGRPO_TASK_ID": task.id,
                "FLOWGRPO_TASK": task.model_dump_json(),
                "FLOWGRPO_API_KEY": self.api_key,
                "OPENAI_BASE_URL": f"{self.server.url}/episodes/{episode_id}/v1",
                "OPENAI_API_KEY": self.api_key,
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            }
        )
        return env

    def _argv(self) -> list[str]:
        if self.agent.command is not None:  # "{python}": the trainer's own interpreter
            return [sys.executable if a == "{python}" else a for a in self.agent.command]
        return [sys.executable, "-m", "flowgrpo.gateway.run_callable", str(self.agent.callable)]

    async def _episode(self, episode_id: str, task: Task, slots: asyncio.Semaphore) -> Trajectory:
        done = self.recorder.wait(episode_id)
        async with slots:
            t0 = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv(),
                    env=self._environment(episode_id, task),
                    cwd=self.agent.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,  # its own process group: a timeout kills its children too
                )
            except OSError as e:
                return self.recorder.end(
                    episode_id,
                    Termination.error,
                    error=f"cannot start the agent program {self._argv()!r}: {e}",
                    excluded="agent:not started",
                )
            try:
                output, _ = await asyncio.wait_for(proc.communicate(), self.agent.timeout_s)
                timed_out = False
            except asyncio.TimeoutError:
                timed_out = True
                _kill_group(proc.pid)
                output, _ = await proc.communicate()
            wall = time.monotonic() - t0
        tail = output.decode(errors="replace")[-_TAIL:] if output else ""
        if done.done():  # the reward was posted: the episode counts, whatever happened after
            traj = done.result()
        elif timed_out:
            traj = self.recorder.end(
                episode_id,
                Termination.error,
                error=f"the agent program ran past rollout.gateway.timeout_s={self.agent.timeout_s:g} s and was killed",
                excluded="agent:timeout",
            )
        elif proc.returncode != 0:
            traj = self.recorder.end(
                episode_id,
                Termination.error,
                error=f"the agent program exited with code {proc.returncode}",
                excluded=f"agent:exit {proc.returncode}",
            )
        else:
            traj = self.recorder.end(
                episode_id,
                Termination.error,
                error="the agent program exited without posting its reward",
                excluded="agent:no reward",
            )
        traj.metadata["wall_s"] = round(wall, 4)
        traj.metadata["agent_exit_code"] = proc.returncode
        if traj.excluded is not None:
            traj.metadata["agent_output"] = tail
            log.warning("episode %s of task %s: %s", episode_id, task.id, traj.metadata.get("error"))
        return traj

    def close(self) -> None:
        """Stop the gateway; episodes still open are ended (there should be none)."""
        self.recorder.end_open("trainer stopped")
        self.server.shutdown()
        self.server.server_close()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def summarize(groups: Sequence[TrajectoryGroup]) -> dict[str, Any]:
    """Counts of a gateway rollout, for logs: episodes, failed ones by reason, context resets."""
    trajs = [t for g in groups for t in g.trajectories]
    failed: dict[str, int] = {}
    for t in trajs:
        if t.excluded is not None:
            failed[t.excluded] = failed.get(t.excluded, 0) + 1
    return {
        "episodes": len(trajs),
        "failed": failed,
        "context_resets": sum(int(t.metadata.get("context_resets", 0)) for t in trajs),
        "turns": sum(len(t.turns) for t in trajs),
    }


__all__ = ["GatewayRollout", "summarize"]
